"""A repair that creates a file (a migration) reaches the merge request: the plan's diff shows it as ``--- /dev/null``
and the sink commits it to the MR branch with GitLab's "create" action (the local server refuses "create" for a
file that exists and "update" for one that does not, as GitLab does)."""

from __future__ import annotations

from bench.gitlab_server import FakeGitLab
from processors.repair.file_patch import FilePatch, unified_diff
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import FIXTURES, deliver, incident, repro

MIGRATION = "bench/shop/migrations/0002_orders_status_key.py"
SOURCE = "from django.db import migrations\n\n\nclass Migration(migrations.Migration):\n    dependencies = []\n"


async def test_a_created_migration_is_committed_to_the_merge_request_branch(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    server.seed_file("bench/shop/jobs.py", (FIXTURES / "jobs_before.py.txt").read_text())
    event = repro()
    patch = event.patch + unified_diff([FilePatch(MIGRATION, None, SOURCE.encode())])
    assert "--- /dev/null\n+++ b/" + MIGRATION in patch
    await deliver(make_sink(merge_requests=True), incident(), event.model_copy(update={"patch": patch}))
    [mr] = server.merge_requests()
    assert server.file(MIGRATION, mr["source_branch"]) == SOURCE
    assert server.file(MIGRATION) is None  # only on the MR branch
    before = (FIXTURES / "jobs_before.py.txt").read_text()
    assert server.file("bench/shop/jobs.py", mr["source_branch"]) not in (None, before)  # the code's repair went too
