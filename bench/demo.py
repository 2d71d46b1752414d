"""``make demo``: the whole loop on real local engines, unattended.

Engines up → the sample shop (v1.0.0, three real concurrency bugs and a row lock held across a slow call) under
concurrent traffic → the daemon finds three incidents and a lock wait (blocked-by) and files them as GitLab issues →
the daemon is killed with SIGKILL and restarted (still four issues) → each incident's repro fails RED, the planned
repairs make it GREEN → each proven repro opens a "Proves #N" merge request on the local GitLab, which runs its tests
and passes its own gate and is merged (bench/demo_mr.py) → main as merged is deployed as v1.1.0 (which also books
the carrier before taking the row lock: a person's fix of the lock wait, no repair planner's) and gets the same
traffic → the proof judge says FIXED on v1.1.0's own telemetry and the issues close → a summary table → everything
stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from bench import demo_mr
from bench.demo_agent import ask
from bench.gitlab_server import FakeGitLab
from bench.shop import db
from streamer.engines import Layout, LocalEngines
from streamer.engines.process import alive
from streamer.runtime.topics import create_topics

REPO = Path(__file__).resolve().parents[1]
TABLES = ("orders", "inventory", "charges")
ROUNDS = int(os.environ.get("DEMO_ROUNDS", "4"))


def daemon_env(tag: str, prefix: str, out: Path) -> dict[str, str]:
    """The demo daemon's settings beyond ``config/demo.toml`` (its short windows, its business rule, the repro
    worker): this run's own graph, group and Debezium topics, and the paths of this checkout."""
    return {
        "TRACE_REPRO_ENVIRONMENT": f"demo_{tag}",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-demo-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.public\.[a-z]+$",
        "TRACE_REPRO_HTTP__PORT": os.environ.get("DEMO_HTTP_PORT", "0"),  # /metrics of the demo daemon (0: none)
        "TRACE_REPRO_REPRO__SOURCE_ROOT": str(REPO),
        "TRACE_REPRO_REPRO__SCHEMA_SQL": str(REPO / "bench" / "shop" / "schema.sql"),
        "TRACE_REPRO_REPRO__OUTPUT_DIR": str(out / "repros"),
    }


def say(text: str) -> None:
    print(f"\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"== {text}", flush=True)


class Demo:
    def __init__(self) -> None:
        default = Layout.default()
        self.run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-demo-"))
        self.out = REPO / "out" / "demo"
        self.engines = LocalEngines(Layout(default.config_dir, default.cache_dir, self.run_dir))
        self.tag = uuid.uuid4().hex[:6]
        self.prefix = f"shop{self.tag}"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self.env: dict[str, str] = {}
        self.gitlab: FakeGitLab | None = None
        self.gitlab_url = os.environ.get("TRACE_REPRO_GITLAB__URL", "")

    # ---- steps -----------------------------------------------------------------------------------------------

    def engines_up(self) -> None:
        say("starting the local engines (first run resolves Kafka and Debezium from Maven Central)")
        self.engines.up()
        for name, seconds in self.engines.timings.items():
            print(f"   {name:<9} up in {seconds:5.1f}s")
        self.pids += [e.pid for e in self.engines.engines.values()]

    def prepare(self) -> None:
        dsn = self.engines.address("postgres")
        db.apply_schema(dsn)
        self.engines.capture([f"public.{t}" for t in TABLES], topic_prefix=self.prefix)
        k = self.engines.address("kafka")
        topics = [f"{self.prefix}.public.{t}" for t in TABLES] + ["otlp_spans", "otlp_logs"]
        asyncio.run(create_topics(k, dict.fromkeys(topics, 1)))
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir(parents=True)
        self.env = {**os.environ, **self.engines.environment(), **daemon_env(self.tag, self.prefix, self.out)}
        print(f"   shop tables captured by Debezium into {self.prefix}.public.<table>; spans on otlp_spans")

    def start_gitlab(self) -> None:
        if self.gitlab_url:
            print(f"   filing issues to {self.gitlab_url} (TRACE_REPRO_GITLAB__URL)")
            return
        self.gitlab = FakeGitLab("127.0.0.1", 0, project="trace-repro/shop", token="demo-token",
                                 state_path=self.out / "gitlab.json").start()  # fmt: skip
        self.gitlab_url = self.gitlab.url
        self.env.update({"TRACE_REPRO_GITLAB__URL": self.gitlab.url, "TRACE_REPRO_GITLAB__PROJECT": "trace-repro/shop",
                         "TRACE_REPRO_GITLAB_TOKEN": "demo-token"})  # fmt: skip
        print(f"   no GitLab configured: a local GitLab-compatible server at {self.gitlab.url}")
        self.start_merge_requests()

    def issues(self) -> list[dict[str, Any]]:
        return self.gitlab.issues() if self.gitlab is not None else []

    def show_issues(self, *, bodies: bool) -> None:
        for issue in self.issues():
            print(f"   #{issue['iid']} [{issue['state']}] {issue['title']}\n      {issue['web_url']}")
            if bodies:
                text = issue["description"].split("<!-- trace-repro:state")[0].rstrip()
                print("      | " + text.replace("\n", "\n      | "))

    def wait_issues(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.issues()) < count and time.monotonic() < deadline:
            time.sleep(0.2)

    def start_daemon(self) -> None:
        cmd = [sys.executable, "-m", "streamer.cli", "run", "--config", str(REPO / "config" / "demo.toml")]
        log = open(self.out / "daemon.log", "ab")  # noqa: SIM115 - lives as long as the daemon
        self.daemon = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.pids.append(self.daemon.pid)
        print(f"   daemon pid {self.daemon.pid} (log: {self.out / 'daemon.log'})")

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        say(f"killing the daemon with SIGKILL (pid {self.daemon.pid}) and starting it again")
        self.daemon.send_signal(signal.SIGKILL)
        self.daemon.wait(10)
        self.start_daemon()

    def traffic(self, version: str, *, source: Path | None = None, rounds: int = ROUNDS,
                blocked_rounds: int | None = None) -> str:  # fmt: skip
        say(f"shop {version}: {rounds} concurrent rounds of checkout/expire, oversell and double charge, and of "
            "ship/discount (a row lock held across the carrier's booking)")  # fmt: skip
        env = {**self.env, "PYTHONPATH": str(source or REPO)}
        out = []
        for scenario, n in (("all", rounds), ("blocked_by", blocked_rounds or rounds)):
            cmd = [sys.executable, "-m", "bench.shop", "--dsn", self.engines.address("postgres"),
                   "--kafka", self.engines.address("kafka"), "--scenario", scenario, "--rounds", str(n),
                   "--version", version, "--environment", "demo"]  # fmt: skip
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=source or REPO, check=True)
            lines = result.stdout.strip().splitlines()
            print("   " + "\n   ".join(lines if scenario == "all" else lines[1:]))
            out.append(result.stdout)
        return "".join(out)

    async def _wait_topic(self, topic: str, done: Any, timeout_s: float) -> list[dict[str, Any]]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=self.engines.address("kafka"),
                                    auto_offset_reset="earliest", group_id=f"demo-{uuid.uuid4().hex[:6]}")  # fmt: skip
        await consumer.start()
        events: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not done(events):
                batch = await consumer.getmany(timeout_ms=500)
                events += [json.loads(m.value) for ms in batch.values() for m in ms if m.value]
        finally:
            await consumer.stop()
        return events

    def wait_incidents(self) -> list[dict[str, Any]]:
        say("waiting for the daemon to find the collisions")

        def enough(events: list[dict[str, Any]]) -> bool:
            incidents = [e for e in events if e.get("kind") == "incident"]
            return len({e["fingerprint"] for e in incidents}) >= 3 and len(incidents) >= 3 * ROUNDS

        events = [e for e in asyncio.run(self._wait_topic("trace-repro.incidents", enough, 120))
                  if e.get("kind") == "incident"]  # fmt: skip
        by_fp: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_fp.setdefault(e["fingerprint"], []).append(e)
        for fp, occurrences in by_fp.items():
            first = occurrences[0]
            print(f"   [{first['severity']}] {first['summary']}")
            print(f"        fingerprint {fp}, {len(occurrences)} occurrence(s); damage: {first['damage']}")
        return events

    def wait_blocked_by(self) -> list[dict[str, Any]]:
        """The blocked-by findings (performance, on the same topic): the first one's evidence."""
        say("waiting for the daemon to find the lock waits (its windows close every 10 s of event time)")

        def blocked(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [e for e in events if e.get("kind") == "finding" and e.get("type") == "blocked_by"]

        found = blocked(asyncio.run(self._wait_topic("trace-repro.incidents", blocked, 90)))
        for fp in dict.fromkeys(e["fingerprint"] for e in found):
            first = next(e for e in found if e["fingerprint"] == fp)
            print(f"   [{first['severity']}] {first['title']} (remedy class: {first['remedy']})")
            print(f"        fingerprint {fp}, {sum(e['fingerprint'] == fp for e in found)} window(s)")
            for line in first["evidence"][:2]:
                print(f"        {line}")
        return found

    def wait_repros(self) -> list[dict[str, Any]]:
        say("the repro worker compiles each incident into a plain pytest file, runs it RED, repairs, runs it GREEN")

        def enough(events: list[dict[str, Any]]) -> bool:
            return len({e["fingerprint"] for e in events}) >= 3

        repros = asyncio.run(self._wait_topic("trace-repro.repros", enough, 300))
        for r in repros:
            green = r["green"]["status"] if r["green"] else "-"
            d = r["divergence"]
            faithful = "faithful" if d["faithful"] else f"DIVERGES at {d['index']} ({d['mismatch']})"
            print(f"   {r['anomaly']:<20} {r['level']}-level test {Path(r['test_path']).name}: "
                  f"RED {r['red']['status']} -> GREEN {green}; {faithful}; proven={r['proven']}")  # fmt: skip
            failure = r["red"]["failure"].splitlines()[0][:110] if r["red"]["failure"] else "-"
            print(f"      production failure reproduced: {failure}")
            for rep in r["repairs"]:
                lock = f"{rep['lock_before']} -> {rep['lock_after']}"
                print(f"      repair {rep['strategy']:<18} {rep['function']:<32} lock {lock}")
        return repros

    # ---- the merge-request path (bench/demo_mr.py) -----------------------------------------------------------

    def start_merge_requests(self) -> None:
        """The shop's source on the local GitLab's main, and the sink opening "Proves #N" merge requests."""
        assert self.gitlab is not None
        files = demo_mr.seed_repository(self.gitlab, REPO)
        self.env["TRACE_REPRO_GITLAB__MERGE_REQUESTS"] = "true"
        print(f"   the shop's source ({files} files) on its main branch; proven repros open merge requests")

    def merge_request_path(self, repros: list[dict[str, Any]]) -> list[demo_mr.MergeRequestRun]:
        """Each proven repro's MR: its tests against the local PostgreSQL, its own gate, merged when it passes."""
        if self.gitlab is None:
            return []
        say("the merge-request path: each proven repro's 'Proves #N' MR runs its tests and its own gate, then merges")
        proven = len({r["fingerprint"] for r in repros if r["proven"]})
        demo_mr.wait_merge_requests(self.gitlab, proven, 120)
        runs = demo_mr.prove_and_merge(self.gitlab, "demo-token", self.engines.address("postgres"), self.out / "mr")
        demo_mr.show(runs, self.gitlab)
        return runs

    def deploy(self, incidents: list[dict[str, Any]], runs: list[demo_mr.MergeRequestRun]) -> Path:
        """``main`` as the merge requests left it when every one merged; else the planned repairs applied here."""
        if self.gitlab is None or not runs or not all(r.merged for r in runs):
            return self.deploy_patched(incidents)
        say("deploying main, as the merge requests left it, as v1.1.0")
        copy = demo_mr.deploy_merged(self.gitlab, self.out / "shop-1.1.0")
        print(f"   {len(runs)} merge request(s) merged; the issues stay open until production proves the fix")
        return copy

    def deploy_patched(self, incidents: list[dict[str, Any]]) -> Path:
        """A copy of the shop with every planned repair applied (plans for one file compose in sequence)."""
        from processors.model.outputs import IncidentEvent
        from processors.repair import apply, plan_repairs

        say("deploying the repaired shop as v1.1.0")
        copy = self.out / "shop-1.1.0"
        shutil.copytree(REPO / "bench", copy / "bench", ignore=shutil.ignore_patterns("__pycache__"))
        firsts = {}
        for e in incidents:
            firsts.setdefault(e["fingerprint"], e)
        for e in firsts.values():
            plan = plan_repairs(IncidentEvent.model_validate(e), root=copy,
                                invariants={"inventory": ["stock >= 0"]},
                                source_map={str(REPO): copy})  # fmt: skip
            apply(plan, copy)
            print("      " + plan.diff.strip().replace("\n", "\n      "))
        return copy

    def wait_verdicts(self) -> list[dict[str, Any]]:
        say("the proof judge watches v1.1.0's own telemetry")

        def enough(events: list[dict[str, Any]]) -> bool:
            return len({e["fingerprint"] for e in events if e["outcome"] == "FIXED"}) >= 4  # 3 incidents, blocked-by

        verdicts = asyncio.run(self._wait_topic("trace-repro.verdicts", enough, 120))
        for v in verdicts:
            r = v["receipt"]
            p = "-" if r["p_value"] is None else f"{r['p_value']:.3g}"
            print(f"   {v['outcome']:<12} {v['contract'][:60]:<60} v{v['version']}: before {r['before_errors']}/"
                  f"{r['before_requests']}, after {r['after_errors']}/{r['after_requests']}, p = {p} "
                  f"(level {r['alpha'] / r['looks']:g}: alpha {r['alpha']:g} over {r['looks']} looks), floor "
                  f"{r['floor']} ({r['test']})")  # fmt: skip
        return verdicts

    def summary(self, incidents: list[dict[str, Any]], findings: list[dict[str, Any]], repros: list[dict[str, Any]],
                verdicts: list[dict[str, Any]]) -> None:  # fmt: skip
        say("summary")
        issues = {}
        for issue in self.issues():
            tags = re.findall(r"trace-repro::fp::([A-Za-z0-9_.-]+)", issue.get("description") or "")
            if tags:  # the fingerprint tag in the issue's footer
                issues[tags[-1]] = issue
        print(f"   {'defect':<20} {'fingerprint':<17} {'occ.':>4}  {'issue':<6} {'RED':<6} {'GREEN':<6} "
              f"{'verdict':<10} issue state")  # fmt: skip
        for fp in dict.fromkeys(e["fingerprint"] for e in incidents):
            occ = sum(1 for e in incidents if e["fingerprint"] == fp)
            anomaly = next(e["anomaly"] for e in incidents if e["fingerprint"] == fp)
            r = next((x for x in repros if x["fingerprint"] == fp), None)
            v = next((x["outcome"] for x in verdicts if x["fingerprint"] == fp and x["outcome"] == "FIXED"), "-")
            i = issues.get(fp)
            red = r["red"]["status"] if r else "-"
            green = r["green"]["status"] if r and r["green"] else "-"
            print(f"   {anomaly:<20} {fp:<17} {occ:>4}  {'#' + str(i['iid']) if i else '-':<6} {red:<6} {green:<6} "
                  f"{v:<10} {i['state'] if i else '-'}")  # fmt: skip
        for fp in dict.fromkeys(e["fingerprint"] for e in findings):  # performance findings: no repro, a person's fix
            occ = sum(1 for e in findings if e["fingerprint"] == fp)
            kind = next(e["type"] for e in findings if e["fingerprint"] == fp)
            v = next((x["outcome"] for x in verdicts if x["fingerprint"] == fp and x["outcome"] == "FIXED"), "-")
            i = issues.get(fp)
            print(f"   {kind:<20} {fp:<17} {occ:>4}  {'#' + str(i['iid']) if i else '-':<6} {'-':<6} {'-':<6} "
                  f"{v:<10} {i['state'] if i else '-'}")  # fmt: skip

    def stop(self) -> None:
        if self.gitlab is not None:
            self.gitlab.stop()
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        self.engines.down()
        left = [p for p in self.pids if alive(p)]
        say(f"stopped the daemon and the engines; processes left behind: {left or 'none'}")


def proven(verdict: dict[str, Any]) -> bool:
    """A FIXED the demo accepts: a non-zero before count, the after build past the floor, p at the per-look level."""
    r = verdict["receipt"]
    return (verdict["outcome"] == "FIXED" and r["before_errors"] > 0 and r["after_requests"] >= r["floor"] > 0
            and r["p_value"] is not None and r["p_value"] <= r["alpha"] / r["looks"])  # fmt: skip


def main() -> int:
    demo = Demo()
    started = time.monotonic()
    try:
        demo.engines_up()
        demo.prepare()
        demo.start_gitlab()
        demo.start_daemon()
        demo.traffic("1.0.0")
        incidents = demo.wait_incidents()
        blocked = demo.wait_blocked_by()
        demo.wait_issues(4)
        say("GitLab issues filed")
        demo.show_issues(bodies=True)
        demo.kill_daemon()
        demo.traffic("1.0.0", rounds=2)  # more occurrences of the same defects after the restart
        repros = demo.wait_repros()
        say("after the restart: the same defects again, still one issue each")
        demo.show_issues(bodies=False)
        mr_runs = demo.merge_request_path(repros)
        patched = demo.deploy(incidents, mr_runs)
        # The repaired code locks before its race point, so the traffic's barrier waits inside the locked section for
        # a peer that is waiting on the lock: a long barrier would hold the row lock as no request does (and the
        # daemon rightly reports those waits as blocked-by); 20 ms stays far below the 100 ms lock waits it names,
        # also on a loaded two-core machine.
        os.environ["SHOP_BARRIER_TIMEOUT_S"] = "0.02"
        demo.env["SHOP_BARRIER_TIMEOUT_S"] = "0.02"
        # The fixed build must serve enough of each route to show the drop. With 6 of 12 requests failing before,
        # the exact test at alpha/2 needs 11 error-free requests; the judge may decide before the collisions of the
        # rounds after the restart reach it (it then counts 4 of 12, and needs 19), so the demo sends 24.
        # The lock wait's before count is its discount requests that waited (up to 6 of 6): with 4 of 6, the same
        # test needs 10 requests without a wait, so the fixed build gets more rounds there.
        demo.traffic("1.1.0", source=patched, rounds=ROUNDS + 8, blocked_rounds=2 * (ROUNDS + 6))
        verdicts = demo.wait_verdicts()
        deadline = time.monotonic() + 60
        while any(i["state"] != "closed" for i in demo.issues()) and time.monotonic() < deadline:
            time.sleep(0.5)
        demo.summary(incidents, blocked, repros, verdicts)
        if demo.gitlab is not None:
            demo_mr.show(mr_runs, demo.gitlab)
        say("a coding agent asks `trace-repro mcp` about it: incident -> repro -> critical path")
        answered = asyncio.run(ask(demo.env))
        blocked_fixed = {v["fingerprint"] for v in verdicts if v["outcome"] == "FIXED"} >= {
            e["fingerprint"] for e in blocked
        }
        issues = demo.issues()
        checks = {
            "the agent's MCP questions answered": answered,
            "3 collision fingerprints": len({e["fingerprint"] for e in incidents}) == 3,
            "4 GitLab issues": len(issues) == 4,
            "1 blocked-by fingerprint": len({e["fingerprint"] for e in blocked}) == 1,
            "the blocked-by finding FIXED": blocked_fixed,
            "every repro proven": all(r["proven"] for r in repros),
            "every issue closed": all(i["state"] == "closed" for i in issues),
            "every FIXED significant": all(proven(v) for v in verdicts if v["outcome"] == "FIXED"),
            "3 merge requests merged": demo.gitlab is None or (len(mr_runs) == 3 and all(r.merged for r in mr_runs)),
        }
        for what, held in checks.items():
            if not held:
                print(f"   NOT MET: {what}")
        if len(issues) != 4:
            print("   issues: " + "; ".join(f"#{i['iid']} [{i['state']}] {i['title']}" for i in issues))
        ok = all(checks.values())
        say(f"done in {time.monotonic() - started:.0f}s: {'the whole loop completed' if ok else 'INCOMPLETE'}")
        return 0 if ok else 1
    finally:
        demo.stop()


if __name__ == "__main__":
    sys.exit(main())
