"""The demo's last step: what a coding agent sees when it asks ``trace-repro mcp`` about the demo's own data.

The server runs as an agent's MCP client would start it (stdio, ``python -m streamer.cli mcp``, the daemon's
environment); the SDK's own client calls list_findings → get_incident → get_repro → run_repro → critical_path and
the demo prints each answer in a line or two. The walk is complete when every call answers, the incident has its
parties, its repro is proven and re-runs RED then GREEN, and the critical path of the incident's route names who
owns the slowest requests' time in the build before the fix and the fixed one (waiting for the fixed build's
statistics window to close).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from processors.model.anomaly import Anomaly

REPO = Path(__file__).resolve().parents[1]
DEPLOY_WAIT_S = 60.0


def _shares(path: dict[str, float]) -> str:
    return ", ".join(f"{owner} {share:.0%}" for owner, share in sorted(path.items(), key=lambda kv: -kv[1]))


async def ask(env: dict[str, str]) -> bool:
    """Walk incident → repro → critical path over MCP; True when every step found what it looks for."""
    args = ["-m", "streamer.cli", "mcp", "--config", str(REPO / "config" / "demo.toml"), "--allow-run-repro"]
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def call(tool: str, **args: Any) -> dict[str, Any]:
            result = await session.call_tool(tool, args)
            text = result.content[0].text if result.content else "{}"  # type: ignore[union-attr]
            if result.isError:
                raise RuntimeError(f"{tool}: {text}")
            print(f"   > {tool} {json.dumps(args)}")
            answer: dict[str, Any] = json.loads(text)
            return answer

        tools = (await session.list_tools()).tools
        print(f"   the agent's MCP client sees {len(tools)} tools: {', '.join(t.name for t in tools)}")
        findings = (await call("list_findings", limit=10))["items"]
        for i in findings:
            print(f"     {i['anomaly']:<20} {i['fingerprint']} {i['state']:<6} {i['occurrences']} occurrences")
        incidents = [i for i in findings if i["anomaly"] in set(Anomaly.collisions())]  # the ones with a repro
        if not incidents:
            return False
        fp = incidents[0]["fingerprint"]
        incident = await call("get_incident", fingerprint=fp)
        parties = ", ".join(sorted({f"{p['role']} {p['function']} ({p['route']})" for p in incident["parties"]}))
        print(f"     {incident['summary']}\n     parties: {parties}; timeline: {incident['timeline']['count']} "
              f"accesses; a Mermaid sequence diagram of {len(incident['mermaid'].splitlines())} lines")  # fmt: skip
        repro = await call("get_repro", fingerprint=fp)
        print(f"     {repro['level']}-level test {Path(repro['test_path']).name}: RED {repro['red']}, GREEN "
              f"{repro['green']}, proven {repro['proven']}; {repro['divergence']['meaning']}")  # fmt: skip
        for line in repro["patch"]["text"].splitlines()[:6]:
            print(f"       {line}")
        rerun = await call("run_repro", fingerprint=fp)
        print(f"     re-run now: RED {rerun['red']['status']} (reproduced: {rerun['reproduced']}), GREEN on the "
              f"repaired copy {rerun['green']['status']} (fixed: {rerun['fixed']})")  # fmt: skip
        paths = (await call("critical_path"))["operations"]["items"]
        for op in paths:
            print(f"     {op['operation']} v{op['version']}: p95 {op['p95_ms']:.1f} ms over {op['requests']} "
                  f"requests; critical path {_shares(op['critical_path'])}")  # fmt: skip
        route = incident["parties"][0]["route"]
        deadline = time.monotonic() + DEPLOY_WAIT_S
        while True:  # the fixed build's statistics window closes one window (10 s in the demo) after its traffic
            mine = await call("critical_path", operation=route)
            if "deploy" in mine or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        for version, build in mine["builds"].items():
            print(f"     {mine['operation']} v{version}: {build['requests']:.0f} requests, "
                  f"critical path {_shares(build['shares'])}")  # fmt: skip
        deploy = mine.get("deploy")
        if deploy:
            moves = ", ".join(f"{m['owner']} {m['before']:.0%} -> {m['after']:.0%}" for m in deploy["shifts"])
            print(f"     deploy {deploy['before']} -> {deploy['after']}: {moves}")
        return (bool(incident["parties"]) and bool(repro["proven"]) and rerun["reproduced"] and rerun["fixed"]
                and bool(paths) and deploy is not None)  # fmt: skip
