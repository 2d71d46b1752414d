"""A service's checkout, read once: every function with the SQL it passes, every route, every ORM model (Python
files with libcst, Java files with a tokeniser: ``processors.codeloc.javascan``).

Built when the locator first needs the checkout and kept for the daemon's life (a checkout does not change under a
running daemon; a new build is a new deploy). Bounded: at most ``max_files`` files (in sorted path order, so the
same files every time), none larger than ``max_file_bytes``; what is left out is counted by reason
(``max_files``, ``max_file_bytes``, ``unparsable``, ``unreadable``). Directories of installed packages, virtual
environments, caches and hidden directories are not the service's code and are not read, nor are tests (``exclude``:
a test passes the same SQL as the code it tests, and would make every statement ambiguous).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from processors.api.telemetry import Telemetry
from processors.codeloc.javascan import scan_java
from processors.codeloc.routes import join_route
from processors.codeloc.scan import ModuleScan, scan_module
from processors.codeloc.statements import Shape, normalise, shape_of, singular

_SKIP_DIRS: Final = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages", "venv", "target"})
_SUFFIXES: Final = (".py", ".java", ".kt")


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement a function passes: its normalised text, its shape and the line it is written on."""

    text: str
    shape: Shape | None
    line: int


@dataclass(frozen=True, slots=True)
class Function:
    name: str  # module-qualified: shop.views.withdraw, shop.views.AccountView.post
    file: str  # local absolute path
    line: int  # the def line
    end_line: int
    calls: frozenset[str]
    names: frozenset[str]
    assigned: frozenset[str]
    statements: tuple[Statement, ...]


@dataclass(frozen=True, slots=True)
class Route:
    pattern: str  # normalised (routes.normalise_route)
    methods: frozenset[str]  # empty: any method
    handler: str  # module-qualified function (or class: a class-based view)


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(ref: str, package: str) -> str:
    """A relative import's target made absolute from ``package``."""
    if not ref.startswith("."):
        return ref
    dots = len(ref) - len(ref.lstrip("."))
    base = package.split(".") if package else []
    base = base[: len(base) - (dots - 1)] if dots > 1 else base
    return ".".join([*base, ref.lstrip(".")]).strip(".")


class CheckoutIndex:
    """See the module docstring; built by :meth:`build`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.functions: dict[str, Function] = {}
        self.by_file: dict[str, list[Function]] = {}
        self.files: dict[str, str] = {}  # relative posix path -> local absolute path (every source file read)
        self.routes: list[Route] = []
        self.models: dict[str, set[str]] = {}  # table (bare, lower) -> model class names
        self.classes: set[str] = set()
        self.by_short: dict[str, list[str]] = {}  # last name part -> functions
        self.callers: dict[str, set[str]] = {}  # function -> functions that call it (by its last name part)

    @classmethod
    def build(cls, root: Path, *, max_files: int, max_file_bytes: int, telemetry: Telemetry,
              exclude: Sequence[str] = ()) -> CheckoutIndex:  # fmt: skip
        index = cls(root)
        scans: list[tuple[str, str, str, ModuleScan]] = []  # (module, package, file, scan)
        for n, path in enumerate(_sources(root, tuple(exclude))):
            if n >= max_files:
                telemetry.drop("max_files")
                continue
            rel = path.relative_to(root)
            index.files[rel.as_posix()] = str(path)
            if path.suffix not in (".py", ".java"):
                continue
            try:
                if path.stat().st_size > max_file_bytes:
                    telemetry.drop("max_file_bytes")
                    continue
                data = path.read_bytes()
            except OSError:
                telemetry.drop("unreadable")
                continue
            module = module_name(rel)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            try:
                if path.suffix == ".java":
                    java_package, scan = scan_java(data.decode("utf-8", "replace"))
                    scans.append((java_package or package, "", str(path), scan))
                    continue
                scans.append((module, package, str(path), scan_module(data, package)))
            except Exception:  # a file libcst cannot read is counted and left out, whatever it raised
                telemetry.drop("unparsable")
        for module, package, file, scan in scans:
            index._add(module, package, file, scan)
        index._mount(scans)
        for fn in index.functions.values():
            for called in fn.calls:
                for target in index.by_short.get(called, ()):
                    index.callers.setdefault(target, set()).add(fn.name)
        telemetry.gauge("indexed_files", len(index.files))
        telemetry.gauge("indexed_functions", len(index.functions))
        telemetry.gauge("indexed_routes", len(index.routes))
        return index

    def _add(self, module: str, package: str, file: str, scan: ModuleScan) -> None:
        shapes: dict[str, Shape | None] = {}
        for f in scan.functions:
            statements = []
            for text, line in f.sql:
                norm = normalise(text)
                if norm not in shapes:
                    shapes[norm] = shape_of(text)
                statements.append(Statement(norm, shapes[norm], line))
            name = f"{module}.{f.qualname}" if module else f.qualname
            fn = Function(name, file, f.line, f.end_line, frozenset(f.calls), frozenset(f.names),
                          frozenset(f.assigned), tuple(statements))  # fmt: skip
            self.functions[name] = fn
            self.by_file.setdefault(file, []).append(fn)
            self.by_short.setdefault(f.qualname.rsplit(".", 1)[-1], []).append(name)
        for cls_name, table in scan.models.items():
            self.models.setdefault(table.rsplit(".", 1)[-1].lower(), set()).add(cls_name)
        self.classes |= scan.classes

    def _mount(self, scans: list[tuple[str, str, str, ModuleScan]]) -> None:
        """Routes with every prefix their router may be mounted under (a route is matched in any of its forms;
        two handlers that then match one request are reported as candidates, never one of them as fact)."""
        mounted: dict[str, set[str]] = {}  # router variable -> prefixes it is mounted with anywhere
        included: dict[str, set[tuple[str, str]]] = {}  # Django urls module -> (including module, prefix)
        for module, package, _, scan in scans:
            for router, prefix in scan.mounts:
                mounted.setdefault(router, set()).add(prefix)
            for r in scan.routes:
                if r.include:
                    included.setdefault(_absolute(r.include, package), set()).add((module, r.path))

        def prefixes(module: str, depth: int = 3) -> set[str]:
            out: set[str] = set()
            for outer, prefix in included.get(module, ()) if depth else ():
                out |= {prefix} | {join_route(p, prefix) for p in prefixes(outer, depth - 1)}
            return out

        seen: set[Route] = set()
        for module, package, _, scan in scans:
            for r in scan.routes:
                if r.include:
                    continue
                handler = self._handler(module, package, scan, r.handler)
                own = scan.built.get(r.router, "")
                variants = {join_route(own, r.path)}  # Flask: a mount's prefix replaces the blueprint's
                variants |= {
                    join_route(p, q) for p in mounted.get(r.router, ()) for q in (r.path, join_route(own, r.path))
                }
                variants |= {join_route(p, r.path) for p in prefixes(module)}
                for path in variants:
                    route = Route(join_route("", path), r.methods, handler)
                    if route not in seen:
                        seen.add(route)
                        self.routes.append(route)

    def _handler(self, module: str, package: str, scan: ModuleScan, ref: str) -> str:
        head, _, rest = ref.partition(".")
        if head in scan.imports:
            target = _absolute(scan.imports[head], package)
            return f"{target}.{rest}" if rest else target
        return f"{module}.{ref}" if module else ref

    # -- lookups -----------------------------------------------------------------------------------------------
    def function_at(self, file: str, line: int) -> Function | None:
        """The innermost function of ``file`` whose lines hold ``line``."""
        best: Function | None = None
        for fn in self.by_file.get(file, ()):
            if fn.line <= line <= fn.end_line and (best is None or fn.line >= best.line):
                best = fn
        return best

    def find_file(self, recorded: str, source_map: dict[str, str]) -> str | None:
        """The local file a recorded path names: through ``source_map``, under the root, else the indexed file
        with the longest common path suffix (at least the file name; a tie between files is no answer)."""
        for prefix, local in sorted(source_map.items(), key=lambda kv: -len(kv[0])):
            if recorded.startswith(prefix):
                path = (self.root / local / recorded[len(prefix) :].lstrip("/")).resolve()
                rel = _relative(path, self.root)
                if rel is not None and rel in self.files:
                    return self.files[rel]
        rel = _relative(Path(recorded), self.root)
        if rel is not None and rel in self.files:
            return self.files[rel]
        parts = Path(recorded).parts
        for k in range(len(parts), 0, -1):
            tail = "/".join(parts[-k:])
            hits = [local for rel, local in self.files.items() if rel == tail or rel.endswith("/" + tail)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                return None
        return None

    def callees(self, name: str, depth: int) -> set[str]:
        """``name`` and the functions it calls, ``depth`` calls deep (by their last name part)."""
        tree, frontier = {name}, [name]
        for _ in range(depth):
            nxt = []
            for fn_name in frontier:
                fn = self.functions.get(fn_name)
                for called in fn.calls if fn is not None else ():
                    for target in self.by_short.get(called, ()):
                        if target not in tree:
                            tree.add(target)
                            nxt.append(target)
            frontier = nxt
        return tree

    def tables_models(self, table: str) -> set[str]:
        """The model classes of ``table``: declared (``__tablename__``, ``Meta.db_table``), else named for it."""
        bare = table.rsplit(".", 1)[-1].lower()
        declared = self.models.get(bare)
        if declared:
            return set(declared)
        names = singular(bare)
        return {c for c in self.classes if c.lower() in names}


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix() if path.is_absolute() else None
    except ValueError:
        return None


def _sources(root: Path, exclude: tuple[str, ...]) -> Iterator[Path]:
    """The source files under ``root`` in sorted order, but for excluded names (globs) and non-code directories."""

    def kept(name: str) -> bool:
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in exclude)

    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS and kept(d))
        for name in sorted(files):
            if name.endswith(_SUFFIXES) and kept(name):
                yield Path(directory) / name
