"""The findings tools: findings of every type (incidents, regressions, every registered type: evidence, timeline,
Mermaid, typed data), repros, verdicts and receipts, proof contracts."""

from __future__ import annotations

import asyncio
import difflib
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import Field, ValidationError

from processors.connectors.proofs.contracts import min_requests_for, parse_signature
from processors.model.anomaly import Anomaly
from processors.model.contract import DEFAULT_ALPHA, DEFAULT_WATCH_S, ProofContract
from processors.model.finding import FINDING_TYPES
from processors.repro.paths import UnsafePath, under
from processors.repro.runner import environment, scratch
from sinks.graph import analytics as q
from streamer.contract_cli import kafka_publish
from streamer.mcp.common import Tools, clip, page, rows, since_ms

Limit = Annotated[int, Field(ge=1, le=200, description="the most items to return")]
Fingerprint = Annotated[str, Field(min_length=1, max_length=128, description="the finding's fingerprint")]
Class = Annotated[str | None, Field(description="only this class or finding type (the tool's description lists them)")]
Service = Annotated[str | None, Field(description="only findings involving this service")]
State = Annotated[str | None, Field(description="open, or fixed (by a FIXED verdict, until an occurrence after it)")]
Since = Annotated[str | None, Field(description="last seen after: 30m, 2h, 7d, ISO-8601 or unix ms")]
_MERMAID_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:/*{}()=+-]")
_RUN_TIMEOUT_S = 120


def _m(text: Any) -> str:
    """Untrusted text as a Mermaid label: only harmless characters, bounded."""
    return _MERMAID_UNSAFE.sub("_", str(text or ""))[:80]


def mermaid(parties: list[dict[str, Any]], timeline: list[dict[str, Any]], entity: str) -> str:
    """A sequence diagram: culprit and victim requests against the row, every access and commit in order."""
    lines = ["sequenceDiagram", "    participant C as culprit", "    participant V as victim",
             f"    participant E as {_m(entity) or 'row'}"]  # fmt: skip
    for p in parties:
        lines.append(
            f"    Note over {'C' if p['role'] == 'culprit' else 'V'}: {_m(p['service'])} {_m(p['trace'])[:12]}"
        )
    t0 = min((e["at"] for e in timeline if e["at"] is not None), default=0.0)
    for e in timeline:
        who = "C" if e["role"] == "culprit" else "V"
        at = f"+{(e['at'] or t0) - t0:.1f}ms"
        lines.append(f"    {who}->>E: {_m(e['access'])} {_m(e['function'])} lock={_m(e['lock'])} {at}")
        if e.get("commit_ms") is not None:
            lines.append(f"    E-->>{who}: committed +{e['commit_ms'] - t0:.1f}ms")
    return "\n".join(lines)


def classes() -> list[str]:
    """The classes a finding can have: the anomalies (``regression`` among them), then every registered finding type
    (the detectors this process was built with register theirs)."""
    known = [a.value for a in Anomaly]
    return [*known, *sorted(t for t in FINDING_TYPES if t not in known)]


async def list_findings(
    tools: Tools,
    *,
    service: str | None = None,
    anomaly: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 20,
) -> dict[str, Any]:
    """Findings of every type, most recently seen first (``anomaly``: one class or type): ``list_findings``,
    ``list_incidents`` and ``trace-repro findings list``."""
    params = {"service": service, "anomaly": anomaly, "state": state, "since": since_ms(since), "limit": limit + 1}
    found = await rows(tools, q.INCIDENTS, params)
    items = [{"fingerprint": r[0], "anomaly": r[1], "type": r[1], "severity": r[2], "state": r[3], "summary": r[4],
              "first_seen_unix_ms": r[5], "last_seen_unix_ms": r[6], "occurrences": r[7],
              "on": [x for x in r[8] if x], "services": sorted({x for x in r[9] if x})} for r in found]  # fmt: skip
    return page(items, limit)


async def get_finding(tools: Tools, fingerprint: str, *, occurrences: int = 10, timeline_events: int = 50
                      ) -> dict[str, Any]:  # fmt: skip
    """One finding's evidence: ``get_finding``, ``get_incident`` and ``trace-repro findings show`` (:class:`ToolError`
    if unknown). A finding of a registered type also has ``finding``: its type, title, subject, remedy, typed data,
    evidence lines, example traces and contract signature."""
    fp = {"fp": fingerprint}
    head = await rows(tools, q.INCIDENT, fp)
    if not head:
        raise ToolError(f"no incident with fingerprint {fingerprint!r} (list_incidents shows the known ones)")
    h = head[0]
    occ = await rows(tools, q.OCCURRENCES, {**fp, "limit": occurrences + 1})
    parties = [{"role": r[0].lower(), "span": r[1], "trace": r[2], "service": r[3], "version": r[4],
                "function": r[5], "route": r[6]} for r in await rows(tools, q.PARTIES, fp)]  # fmt: skip
    events = await rows(tools, q.TIMELINE, {**fp, "limit": timeline_events + 1})
    timeline = [{"role": r[0].lower(), "trace": r[1], "service": r[2], "span": r[3], "access": r[4], "at": r[5],
                 "lock": r[6], "op": r[7], "function": r[8], "commit_ms": r[9], "entity": r[10],
                 "statement": clip(r[11], 500)["text"]} for r in events]  # fmt: skip
    repro = await rows(tools, q.REPRO, fp)
    contracts = await rows(tools, q.CONTRACTS_OF, fp)
    on = [x for x in h[12] if x]
    out: dict[str, Any] = {
        "fingerprint": h[0], "anomaly": h[1], "severity": h[2], "state": h[3], "summary": h[4],
        "first_seen_unix_ms": h[5], "last_seen_unix_ms": h[6], "occurrences_total": h[7], "table": h[8],
        "window_ms": h[9], "metric": h[10], "signature": h[11], "on": on,
        "occurrences": page([{"id": r[0], "at_unix_ms": r[1], "entity": r[2], "manifest": r[3],
                              "writers": r[4], "version": r[5], "commit": r[6], "window": r[7],
                              "p_adjusted": r[8], "traces": r[9] or []} for r in occ], occurrences),
        "parties": parties,
        "timeline": page(timeline, timeline_events),
        "repro": [{"path": r[0], "status": r[1], "level": r[2], "faithful": r[3], "red": r[4], "green": r[5]}
                  for r in repro],
        "contracts": [{"signature": r[0], "service": r[1], "version": r[2], "issue": r[3],
                       "verdicts": [v for v in r[4] if v]} for r in contracts],
    }  # fmt: skip
    if h[13] is not None:  # a finding of a registered type: what it published of itself
        out["finding"] = {"type": h[13], "title": h[14], "remedy": h[15],
                          "subject": {"service": h[16], "operation": h[17], "entity": h[18]},
                          "data": json.loads(h[19] or "{}"), "evidence": h[20] or [], "traces": h[21] or [],
                          "contract": h[22]}  # fmt: skip
    if parties or timeline:
        out["mermaid"] = mermaid(parties, timeline[:timeline_events], on[0] if on else "")
    else:
        out["mermaid"] = "flowchart LR\n    I[" + _m(h[1]) + "] --> O[" + _m(on[0] if on else "?") + "]"
    return out


def register(mcp: FastMCP, tools: Tools) -> None:
    """Add the findings tools to ``mcp``."""
    s = tools.settings
    listing = (
        "Findings of every type (incidents, regressions, each registered detector's), most recently seen first: "
        "class (`type`), severity, state, summary, what they are on, services. The classes this daemon emits "
        f"(filter with `type`; `anomaly` is its first name): {', '.join(classes())}."
    )

    @mcp.tool(name="list_findings", description=listing)
    @mcp.tool(name="list_incidents", description=listing)  # its first name, kept for agents configured with it
    async def list_all(service: Service = None, type: Class = None, state: State = None, since: Since = None,
                       limit: Limit = 20, anomaly: Class = None) -> dict[str, Any]:  # fmt: skip
        return await list_findings(tools, service=service, anomaly=type or anomaly, state=state, since=since,
                                   limit=limit)  # fmt: skip

    @mcp.tool(name="get_finding")
    @mcp.tool(name="get_incident")  # its first name, kept for agents configured with it
    async def get_one(fingerprint: Fingerprint, occurrences: Limit = 10, timeline_events: Limit = 50
                      ) -> dict[str, Any]:  # fmt: skip
        """One finding's evidence: occurrences, for a collision its culprit and victim requests and the timeline of
        their accesses and commits on the row (a Mermaid sequence diagram), for a finding of a registered type its
        typed data, evidence lines and example traces; its repro, contracts and verdicts."""
        return await get_finding(tools, fingerprint, occurrences=occurrences, timeline_events=timeline_events)

    @mcp.tool()
    async def get_repro(fingerprint: Fingerprint) -> dict[str, Any]:
        """An incident's reproduction: the generated pytest source, the planned patch (each repaired statement and
        lock), RED/GREEN status, and whether it is faithful to production (no divergence)."""
        found = await rows(tools, q.REPRO, {"fp": fingerprint})
        if not found:
            raise ToolError(f"no repro for incident {fingerprint!r} yet (is the repro worker enabled?)")
        path, status, level, faithful, red, green = found[0]
        repairs = [{"strategy": r[0], "file": r[1], "function": r[2], "lock_before": r[3], "lock_after": r[4],
                    "statement_before": r[5], "statement_after": r[6]}
                   for r in await rows(tools, q.REPAIRS, {"fp": fingerprint})]  # fmt: skip
        patch = "".join(
            "".join(difflib.unified_diff([f"{r['statement_before']}\n"], [f"{r['statement_after']}\n"],
                                         f"a/{r['file']}:{r['function']}", f"b/{r['file']}:{r['function']}"))
            for r in repairs
        )  # fmt: skip
        source = _test_source(s.repro_dir, str(path))
        return {"fingerprint": fingerprint, "test_path": path, "level": level, "status": status, "red": red,
                "green": green, "proven": status == "proven",
                "divergence": {"faithful": bool(faithful),
                               "meaning": "the repro ran the statements production ran, in order" if faithful
                               else "the repro's statements diverge from production's: it proves nothing"},
                "test_source": source, "patch": clip(patch), "repairs": repairs}  # fmt: skip

    @mcp.tool()
    async def run_repro(
        fingerprint: Fingerprint,
        runs: Annotated[
            Literal["red", "green", "both"], Field(description="red: the test as production ran; green: after repair")
        ] = "both",
    ) -> dict[str, Any]:
        """Re-run an incident's repro against the scratch PostgreSQL: RED, the stored test on the source as
        recorded (it must fail: the defect reproduced); GREEN, the test the repro worker ran after its repair, on the
        repaired copy of the source it left (it must pass). Only when the server was started with
        --allow-run-repro (or TRACE_REPRO_MCP_RUN_REPRO=1)."""
        if not s.allow_run_repro:
            raise ToolError("run_repro is disabled: start the server with --allow-run-repro "
                            "(or TRACE_REPRO_MCP_RUN_REPRO=1)")  # fmt: skip
        found = await rows(tools, q.REPRO, {"fp": fingerprint})
        if not found:
            raise ToolError(f"no repro for incident {fingerprint!r}")
        test = _resolve(s.repro_dir, str(found[0][0]))
        if not s.repro_dsn:
            raise ToolError("no scratch PostgreSQL: set [repro] dsn or TRACE_REPRO_POSTGRES_DSN")
        out: dict[str, Any] = {"fingerprint": fingerprint}
        if runs in ("red", "both"):
            out["red"] = await asyncio.to_thread(_run_test, test, s.repro_dsn, s.repro_timeout_ms)
        if runs in ("green", "both"):
            green = _green_of(s.repro_dir, fingerprint)
            out["green"] = (
                {"status": "unavailable", "reason": "the repro worker left no GREEN run for it (no repair planned?)"}
                if green is None
                else await asyncio.to_thread(_run_test, green[0], s.repro_dsn, s.repro_timeout_ms, green[1])
            )
        out["reproduced"] = out.get("red", {}).get("status") == "failed" if "red" in out else None
        out["fixed"] = out.get("green", {}).get("status") == "passed" if "green" in out else None
        return out

    @mcp.tool()
    async def list_verdicts(
        service: Annotated[str | None, Field(description="only verdicts on this service's builds")] = None,
        outcome: Annotated[str | None, Field(description="FIXED, NOT_FIXED, WORSE or INSUFFICIENT")] = None,
        fingerprint: Annotated[str | None, Field(description="only verdicts on this incident's contracts")] = None,
        limit: Limit = 20,
    ) -> dict[str, Any]:
        """Proof verdicts on deployed builds, newest first (the receipt key is `key`)."""
        params = {"service": service, "outcome": outcome, "fp": fingerprint, "limit": limit + 1}
        items = [{"key": r[0], "outcome": r[1], "service": r[2], "version": r[3], "commit": r[4], "rollback": r[5],
                  "reason": clip(r[6], 1000)["text"], "at_unix_ms": r[7], "contract": r[8], "fingerprint": r[9]}
                 for r in await rows(tools, q.VERDICTS, params)]  # fmt: skip
        return page(items, limit)

    @mcp.tool()
    async def get_receipt(key: Annotated[str, Field(min_length=1, max_length=512, description="a verdict's key")]
                          ) -> dict[str, Any]:  # fmt: skip
        """The numbers behind one verdict: before/after counts, the test, p-value or interval, version, commit."""
        found = await rows(tools, q.RECEIPT, {"key": key})
        if not found:
            raise ToolError(f"no verdict with key {key!r} (list_verdicts shows the keys)")
        r = found[0]
        return {"key": key, "outcome": r[0], "service": r[1], "version": r[2], "commit": r[3], "rollback": r[4],
                "reason": r[5], "receipt": json.loads(r[6] or "{}"), "contract": r[7],
                "contract_terms": json.loads(r[8]) if r[8] else None}  # fmt: skip

    @mcp.tool()
    async def add_contract(
        fingerprint: Fingerprint,
        signature: Annotated[str, Field(description='"error:<route>:<exception>" or "<anomaly>:<table>:<f>+<g>"')],
        must_start: Annotated[str, Field(min_length=1, description="event name the fix must start emitting")],
        watch_s: Annotated[float, Field(gt=0, le=30 * 86400)] = DEFAULT_WATCH_S,
        min_requests: Annotated[int | None, Field(ge=1, description="traffic floor (default: zero-error rule)")] = None,
        baseline_rate: Annotated[float | None, Field(gt=0, lt=1, description="the defect's rate in the bug")] = None,
        service: str = "",
        version: str = "",
        issue: Annotated[int | None, Field(ge=1)] = None,
        dry_run: Annotated[bool, Field(description="return the contract, publish nothing")] = False,
    ) -> dict[str, Any]:
        """Publish a proof contract on the contracts topic, as `trace-repro contract add` does. Only when the server
        was started with --allow-contracts (or TRACE_REPRO_MCP_CONTRACTS=1)."""
        if not s.allow_contracts:
            raise ToolError("add_contract is disabled: start the server with --allow-contracts "
                            "(or TRACE_REPRO_MCP_CONTRACTS=1)")  # fmt: skip
        import time

        try:
            parse_signature(signature)
            contract = ProofContract(
                signature=signature, fingerprint=fingerprint, must_start=must_start, watch_s=watch_s,
                min_requests=min_requests or min_requests_for(baseline_rate, DEFAULT_ALPHA), alpha=DEFAULT_ALPHA,
                baseline_rate=baseline_rate, service=service, version=version, routes=[], reports=[], issue=issue,
                created_unix_ms=time.time() * 1000,
            )  # fmt: skip
        except (ValueError, ValidationError) as exc:
            raise ToolError(f"not a valid contract: {exc}") from exc
        body = contract.model_dump_json()
        if not dry_run:
            try:
                await kafka_publish(s.kafka_bootstrap, s.contracts_topic, fingerprint.encode(), body.encode())
            except Exception as exc:
                raise ToolError(f"publishing on {s.contracts_topic} failed: {exc}") from exc
        return {"published": not dry_run, "topic": s.contracts_topic, "contract": json.loads(body)}


def _resolve(root: str, path: str) -> Path:
    """``path`` if it is a file under ``root`` (the repro output directory), else a tool error."""
    base = Path(root).resolve()
    target = Path(path).resolve() if Path(path).is_absolute() else (Path.cwd() / path).resolve()
    if not target.is_relative_to(base):
        raise ToolError(f"repro test {path!r} is not under the repro output directory {root!r}")
    if not target.is_file():
        raise ToolError(f"repro test {path!r} is not on this machine (the repro worker writes it there)")
    return target


def _test_source(root: str, path: str) -> dict[str, Any]:
    try:
        return clip(_resolve(root, path).read_text(encoding="utf-8", errors="replace"))
    except ToolError as exc:
        return {"text": "", "truncated": False, "unavailable": str(exc)}


def _green_of(root: str, fingerprint: str) -> tuple[Path, str | None] | None:
    """The GREEN run the repro worker left last for ``fingerprint`` under the output directory ``root`` (of the full
    repro, ``work/<fp>/``, or of the reduced one, ``work/<fp>/reduced/``): the test it ran (``green/test_*.py``)
    and, for an application-level repro, the repaired copy of the source (the newest ``repro-green-*`` beside it);
    None when there is none."""
    try:
        work = under(Path(root), "work", fingerprint)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from exc
    tests = [t for base in (work, work / "reduced") for t in (base / "green").glob("test_*.py")]
    if not tests:
        return None
    test = max(tests, key=lambda t: t.stat().st_mtime)
    patched = sorted(test.parent.parent.glob("repro-green-*"), key=lambda p: p.stat().st_mtime)
    return test, str(patched[-1]) if patched else None


def _run_test(test: Path, dsn: str, statement_timeout_ms: int, source_root: str | None = None) -> dict[str, Any]:
    """One pytest run of a stored repro test in a scratch directory (on ``source_root``'s code when given, else
    where the functions were recorded): ``failed`` when the defect reproduced."""
    with tempfile.TemporaryDirectory(prefix="trace-repro-mcp-") as tmp, scratch(dsn, test.stem) as name:
        work = Path(tmp)
        copy = work / test.name
        copy.write_text(test.read_text(encoding="utf-8"), encoding="utf-8")
        junit = work / "junit.xml"
        env = environment(dsn=dsn, trace=work / "trace.json", statement_timeout_ms=statement_timeout_ms,
                          source_root=source_root, scratch=name)  # fmt: skip
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null",
                   "--rootdir", str(work), str(copy), f"--junitxml={junit}"]  # fmt: skip
        try:  # the run's scratch database and role are dropped however it ends (a timeout kills the test)
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=_RUN_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"status": "error", "output": clip(f"timed out after {_RUN_TIMEOUT_S} s", 200)}
        status = "error"
        if junit.is_file():
            suite = ET.parse(junit).getroot()  # noqa: S314 - the JUnit file our own pytest run just wrote
            if suite.tag != "testsuite":
                inner = suite.find("testsuite")
                suite = inner if inner is not None else suite
            failures, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
            status = "failed" if failures else ("error" if errors else "passed")
        return {"status": status, "exit_code": done.returncode,
                "output": clip(done.stdout[-8000:] + done.stderr[-4000:], 12_000)}  # fmt: skip
