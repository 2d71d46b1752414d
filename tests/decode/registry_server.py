"""A schema registry over real HTTP serving recorded schemas: the Confluent API's ``GET {root}/schemas/ids/{id}`` and
Apicurio's ``GET {root}/ids/globalIds/{id}`` (raw schema text), with a status to force (an outage) and credentials to
require."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCHEMAS: dict[str, str] = json.loads((Path(__file__).parent / "fixtures" / "debezium_avro_schemas.json").read_text())
ROOT = "/api"


@dataclass
class Served:
    """What the server answers and what it was asked; change ``status`` to force every answer."""

    url: str = ""
    status: int = 200
    auth: str = ""  # the Authorization header required ("" none)
    asked: list[str] = field(default_factory=list)


@contextmanager
def registry_server() -> Iterator[Served]:
    served = Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.asked.append(self.path)
            confluent = self.path.startswith(f"{ROOT}/schemas/ids/")
            native = self.path.startswith(f"{ROOT}/ids/globalIds/")
            schema = SCHEMAS.get(self.path.rsplit("/", 1)[-1]) if confluent or native else None
            status = served.status if served.status != 200 else (200 if schema else 404)
            if served.auth and self.headers.get("Authorization") != served.auth:
                status = 401
            body = (json.dumps({"schema": schema}) if confluent else schema or "") if status == 200 else "{}"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body.encode())))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.url = f"http://127.0.0.1:{server.server_port}{ROOT}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
