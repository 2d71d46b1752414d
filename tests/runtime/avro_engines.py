"""A schema registry and a Kafka Connect worker with its Avro converter, for the tests and the fixture recorder.

The running ones are used when there are (``trace-repro local up --registry``, a worker started with the converter
on its plugin path); otherwise private ones are started beside the given Kafka for the caller and stopped after it,
so that a shared ``local up`` started before the registry joined it is neither changed nor restarted.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamer.engines import Layout, LocalEngines, connect, registry
from streamer.engines.process import alive, stop
from streamer.engines.state import EngineState


@contextmanager
def avro_engines(engines: LocalEngines) -> Iterator[tuple[str, EngineState]]:
    """(the Connect worker's REST URL, the registry's state), both able to carry Debezium's Avro form."""
    layout = Layout(config_dir=engines.layout.config_dir, cache_dir=engines.layout.cache_dir,
                    run_dir=Path(tempfile.mkdtemp(prefix="trace-repro-avro-")))  # fmt: skip
    started: list[int] = []
    try:
        found = engines.engines.get("registry")
        if found is None or not (alive(found.pid) and registry.healthy(found)):
            found = registry.start(layout)
            started.append(found.pid)
        url = engines.address("connect")
        if not connect.serves_avro(url):
            worker = connect.start(layout, bootstrap=engines.address("kafka"))
            started.append(worker.pid)
            url = connect.rest_url(worker)
        yield url, found
    finally:
        for pid in reversed(started):
            stop(pid)
        shutil.rmtree(layout.run_dir, ignore_errors=True)
