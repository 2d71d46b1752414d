"""What the benches read off a run from outside: a free port, a fresh topic's end offsets, a group's committed
offsets, a graph's node count, when a daemon's ingest stage got its partition (from its JSON log)."""

from __future__ import annotations

import contextlib
import json
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import falkordb
from aiokafka.admin import AIOKafkaAdminClient

from bench.otlp_gen import Generated


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def end_offsets(gen: Generated) -> dict[int, int]:
    """Messages per partition: the end offset of each partition of a fresh topic."""
    ends: dict[int, int] = {}
    for partition in gen.partitions:
        ends[partition] = ends.get(partition, 0) + 1
    return ends


async def group_committed(admin: AIOKafkaAdminClient, group: str, topic: str) -> int:
    offsets = await admin.list_consumer_group_offsets(group)
    return sum(max(o.offset, 0) for tp, o in offsets.items() if tp.topic == topic)


def graph_of(url: str, name: str) -> Any:
    host, port = url.removeprefix("redis://").rsplit(":", 1)
    return falkordb.FalkorDB(host=host, port=int(port)).select_graph(name)


def node_count(url: str, graph: str, label: str) -> int:
    rows = graph_of(url, graph).query(f"MATCH (n:{label}) RETURN count(n)").result_set
    return int(rows[0][0]) if rows else 0


def delete_graph(url: str, name: str) -> None:
    with contextlib.suppress(Exception):
        graph_of(url, name).delete()


def assigned_at(log: Path, spans_topic: str) -> float | None:
    """Unix time at which the ingest stage got the spans partition, from the daemon's JSON log."""
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"partitions.assigned"' not in line or spans_topic not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                event = json.loads(line)
                return datetime.fromisoformat(event["timestamp"]).timestamp()
    return None
