"""The strict unified-diff applier used for merge requests."""

from __future__ import annotations

import pytest

from sinks.gitlab import patching

PATCH = """\
diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 def f():
-    return 1
+    return 2
 x = 1 + \\
@@ -5,2 +5,2 @@
 y = 3
-z = 4
\\ No newline at end of file
+z = 5
\\ No newline at end of file
--- /dev/null
+++ b/new.py
@@ -0,0 +1,2 @@
+a = 1
+b = 2
--- a/old.py
+++ /dev/null
@@ -1 +0,0 @@
-gone = True
"""
APP = "def f():\n    return 1\nx = 1 + \\\n2\ny = 3\nz = 4"


def test_applies_updates_creations_and_deletions() -> None:
    """Context is checked, the missing final newline is kept, new files are created and old ones deleted."""
    app, new, old = patching.parse(PATCH)
    assert (app.path, new.path, old.path) == ("app.py", "new.py", "old.py")
    assert patching.apply(APP, app) == "def f():\n    return 2\nx = 1 + \\\n2\ny = 3\nz = 5"
    assert patching.apply(None, new) == "a = 1\nb = 2\n"
    assert patching.apply("gone = True\n", old) is None


def test_mismatches_are_errors() -> None:
    """Changed context, a missing file, an existing new file and garbage raise PatchError."""
    app, new, _ = patching.parse(PATCH)
    with pytest.raises(patching.PatchError):
        patching.apply(APP.replace("return 1", "return 7"), app)
    with pytest.raises(patching.PatchError):
        patching.apply(None, app)
    with pytest.raises(patching.PatchError):
        patching.apply("exists\n", new)
    with pytest.raises(patching.PatchError):
        patching.parse("not a patch")
    with pytest.raises(patching.PatchError):
        patching.parse("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n")
