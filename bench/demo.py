"""``make demo``: the local engines, the daemon, and (as later issues land) the sample shop's whole loop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from streamer.engines import LocalEngines


def main() -> int:
    engines = LocalEngines()
    print("== starting the local engines (first run resolves Kafka/Debezium jars from Maven Central)")
    t0 = time.monotonic()
    engines.up()
    for name, seconds in engines.timings.items():
        print(f"   {name:<9} up in {seconds:5.1f}s")
    for s in engines.status():
        print(f"   {s.name:<9} pid {s.pid:>7}  {'healthy' if s.healthy else 'UNHEALTHY'}  {s.address}")
    env = {**os.environ, **engines.environment(), "TRACE_REPRO_HTTP__PORT": "0"}
    daemon = subprocess.Popen([sys.executable, "-m", "streamer.cli", "run"], env=env)
    try:
        print(f"== daemon running (pid {daemon.pid}); engines up in {time.monotonic() - t0:.1f}s")
        time.sleep(float(os.environ.get("DEMO_SECONDS", "8")))
        return 0 if daemon.poll() is None else 1
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        stopped = engines.down()
        print(f"== stopped the daemon and {len(stopped)} engines; nothing left running")


if __name__ == "__main__":
    sys.exit(main())
