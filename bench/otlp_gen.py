"""Realistic OTLP span batches for the benchmarks, built directly as ``TracesData`` protobufs (no OTel SDK).

A small shop: ``frontend`` serves the requests and calls ``checkout``, ``inventory`` and ``shipping``; ``checkout``
calls ``inventory``, ``payments`` and ``shipping``. Every hop is a CLIENT span in the caller, a SERVER span in the
callee (``http.route``, ``http.response.status_code``) and an INTERNAL handler span (``code.function.name``,
``code.file.path``); handlers run PostgreSQL statements (CLIENT spans with ``db.query.text`` and
``db.statement.parameters`` as a tuple repr), about 10% of all spans. About 1% of traces fail: the failing handler
records an ``exception`` event and the error propagates up to the root (status ERROR, HTTP 500).

Traces start as a Poisson process (``traces_per_s``) from ``start_ns``; spans reach the "collector" in the order
they end, and are cut into messages of exactly ``spans_per_message`` spans (the batch processor under load),
each grouped by resource (two instances per service) and instrumentation scope. With ``partitions`` > 1 every
trace belongs to one partition (a hash of its id, as the collector's ``partition_traces_by_id`` keys it), and each
partition's spans are cut into messages of their own, so a consumer group can split the topic by partition
without splitting a trace; the spans of one partition that reach the collector together stay in one message.
With ``shape="collector"`` the messages are shaped as a stock OpenTelemetry Collector writes them
(``config/otel-collector.yaml``: batch processor, then the kafka exporter with ``partition_traces_by_id``): the
spans are cut into batches of ``spans_per_message`` in the order they end, across partitions, and each batch is
split into one message per resource, instrumentation scope and trace id, keyed by the trace id in hex, on that
trace's partition. Every message then holds exactly one trace, and a trace whose spans reach the collector in
two batches, or come from two services or scopes, is several messages with the same key.
Everything is drawn from one ``random.Random(seed)``, so the bytes are identical for the same
``(seed, start_ns)``; every trace and span id is fresh, so the messages of one run can be replayed once without
id collisions.
"""

from __future__ import annotations

import heapq
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status, TracesData

US = 1_000
MS = 1_000_000
SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"
INSTANCES_PER_SERVICE = 2
DB_PROBABILITY = 0.44  # per handler of a non-frontend service: ~10% of all spans are DB client spans
ERROR_PROBABILITY = 0.01  # per trace
SHAPES = ("bench", "collector")  # how spans are cut into messages (see the module docstring)

Params = Callable[[random.Random], tuple[object, ...]]


def _order(r: random.Random) -> int:
    return r.randint(1, 200_000)


def _item(r: random.Random) -> int:
    return r.randint(1, 5_000)


def _money(r: random.Random) -> float:
    return round(r.uniform(5, 500), 2)


def _reserve(r: random.Random) -> tuple[int, int, int]:
    quantity = r.randint(1, 3)
    return quantity, _item(r), quantity


@dataclass(frozen=True, slots=True)
class Statement:
    text: str
    operation: str
    table: str
    params: Params


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    version: str
    routes: tuple[tuple[str, str], ...]  # (method, route)
    handler: str  # code.function.name prefix
    file: str
    statements: tuple[Statement, ...] = ()
    downstream: tuple[tuple[str, float], ...] = ()  # (callee, probability of a call per request)


SERVICES: dict[str, Service] = {
    s.name: s
    for s in (
        Service(
            "frontend",
            "2.14.1",
            (("GET", "/"), ("GET", "/product/{id}"), ("POST", "/cart"), ("POST", "/checkout"), ("GET", "/orders/{id}")),
            "frontend.views",
            "frontend/views.py",
            downstream=(("checkout", 0.6), ("inventory", 0.5), ("shipping", 0.25)),
        ),
        Service(
            "checkout",
            "1.9.0",
            (("POST", "/orders"), ("GET", "/orders/{id}"), ("PATCH", "/orders/{id}")),
            "checkout.orders",
            "checkout/orders.py",
            (
                Statement(
                    "UPDATE orders SET status = %s WHERE id = %s",
                    "UPDATE",
                    "orders",
                    lambda r: (r.choice(("paid", "packed", "cancelled")), _order(r)),
                ),
                Statement(
                    "SELECT id, status, total FROM orders WHERE id = %s", "SELECT", "orders", lambda r: (_order(r),)
                ),
                Statement(
                    "INSERT INTO orders (id, customer_id, total, status) VALUES (%s, %s, %s, %s)",
                    "INSERT",
                    "orders",
                    lambda r: (_order(r), r.randint(1, 50_000), _money(r), "new"),
                ),
            ),
            (("inventory", 0.5), ("payments", 0.6), ("shipping", 0.3)),
        ),
        Service(
            "inventory",
            "3.2.7",
            (("GET", "/stock/{sku}"), ("POST", "/reservations")),
            "inventory.stock",
            "inventory/stock.py",
            (
                Statement(
                    "SELECT id, stock FROM inventory WHERE sku = %s",
                    "SELECT",
                    "inventory",
                    lambda r: (f"SKU-{r.randint(1, 5_000):05d}",),
                ),
                Statement(
                    "SELECT id, stock FROM inventory WHERE id = %s FOR UPDATE",
                    "SELECT",
                    "inventory",
                    lambda r: (_item(r),),
                ),
                Statement(
                    "UPDATE inventory SET stock = stock - %s WHERE id = %s AND stock >= %s",
                    "UPDATE",
                    "inventory",
                    _reserve,
                ),
            ),
        ),
        Service(
            "payments",
            "0.31.2",
            (("POST", "/charges"), ("GET", "/charges/{id}")),
            "payments.charges",
            "payments/charges.py",
            (
                Statement(
                    "INSERT INTO charges (order_id, amount) VALUES (%s, %s)",
                    "INSERT",
                    "charges",
                    lambda r: (_order(r), _money(r)),
                ),
                Statement(
                    "UPDATE payments SET status = %s, version = version + 1 WHERE id = %s AND version = %s",
                    "UPDATE",
                    "payments",
                    lambda r: (r.choice(("captured", "refunded")), r.randint(1, 100_000), r.randint(1, 9)),
                ),
                Statement(
                    "SELECT id, status, amount FROM payments WHERE id = %s",
                    "SELECT",
                    "payments",
                    lambda r: (r.randint(1, 100_000),),
                ),
            ),
        ),
        Service(
            "shipping",
            "5.0.3",
            (("POST", "/shipments"), ("GET", "/shipments/{id}")),
            "shipping.shipments",
            "shipping/shipments.py",
            (
                Statement(
                    "INSERT INTO shipments (id, order_id, carrier) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                    "INSERT",
                    "shipments",
                    lambda r: (r.randint(1, 300_000), _order(r), r.choice(("ups", "dhl", "postnl"))),
                ),
                Statement(
                    "SELECT id, status FROM shipments WHERE order_id = %s",
                    "SELECT",
                    "shipments",
                    lambda r: (_order(r),),
                ),
                Statement(
                    "UPDATE shipments SET status = %s WHERE id = %s",
                    "UPDATE",
                    "shipments",
                    lambda r: (r.choice(("label", "in_transit", "delivered")), r.randint(1, 300_000)),
                ),
            ),
        ),
    )
}
EXCEPTIONS = (
    ("psycopg.errors.SerializationFailure", "could not serialize access due to concurrent update"),
    ("psycopg.errors.LockNotAvailable", "canceling statement due to lock timeout"),
    ("requests.exceptions.ReadTimeout", "HTTPConnectionPool(host='payments', port=8080): Read timed out."),
    ("KeyError", "'sku'"),
)
SCOPES = (
    ("opentelemetry.instrumentation.flask", "0.66b2"),
    ("opentelemetry.instrumentation.requests", "0.66b2"),
    ("opentelemetry.instrumentation.psycopg", "0.66b2"),
    ("shop.app", "1.0.0"),
)
SERVER_SCOPE, HTTP_SCOPE, DB_SCOPE, APP_SCOPE = range(4)


def _kv(key: str, value: str | int | bool) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


@dataclass(slots=True)
class _Spec:
    """One span before encoding: a template with the constant attributes, plus what varies per span."""

    template: Span
    resource: int
    scope: int
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    start_ns: int
    end_ns: int
    http_status: int = 0  # SERVER/HTTP CLIENT spans: http.response.status_code
    text: tuple[tuple[str, str], ...] = ()  # per-span string attributes (url.path, parameters, ...)
    error: bool = False
    exception: tuple[str, str] | None = None
    parent: _Spec | None = None


@dataclass(slots=True)
class Generated:
    """The encoded messages and what went into them."""

    messages: list[bytes] = field(default_factory=list)
    span_counts: list[int] = field(default_factory=list)  # spans per message
    partitions: list[int] = field(default_factory=list)  # the Kafka partition of each message
    keys: list[bytes] = field(default_factory=list)  # the record key of each message (collector shape only)
    spans: int = 0
    traces: int = 0
    db_spans: int = 0
    error_traces: int = 0
    start_ns: int = 0  # first trace start
    end_ns: int = 0  # last span end

    @property
    def bytes(self) -> int:
        return sum(map(len, self.messages))


class _Builder:
    """Templates, resources and the per-trace random walk over the call graph."""

    def __init__(self, rng: random.Random, stock: bool = False) -> None:
        self.rng = rng
        self.stock = stock  # as stock instrumentation sends them: no statement parameters, no ``code.*``
        self.resources: list[Resource] = []
        self.instances: dict[str, list[int]] = {}
        for name, svc in SERVICES.items():
            for i in range(INSTANCES_PER_SERVICE):
                self.instances.setdefault(name, []).append(len(self.resources))
                attrs = [
                    _kv("service.name", name),
                    _kv("service.version", svc.version),
                    _kv("deployment.environment.name", "bench"),
                    _kv("service.namespace", "shop"),
                    _kv("service.instance.id", str(uuid.UUID(bytes=rng.randbytes(16), version=4))),
                    _kv("host.name", f"{name}-{i}"),
                    _kv("process.pid", rng.randint(100, 60_000)),
                    _kv("process.runtime.name", "cpython"),
                    _kv("process.runtime.version", "3.12.7"),
                    _kv("telemetry.sdk.language", "python"),
                    _kv("telemetry.sdk.name", "opentelemetry"),
                    _kv("telemetry.sdk.version", "1.45.2"),
                ]
                self.resources.append(Resource(attributes=attrs))
        self.scopes = [InstrumentationScope(name=n, version=v) for n, v in SCOPES]
        self._templates: dict[tuple[object, ...], Span] = {}

    # -- templates: constant name, kind and attributes -----------------------------------------------------------
    def _template(self, key: tuple[object, ...], make: Callable[[], Span]) -> Span:
        t = self._templates.get(key)
        if t is None:
            t = self._templates[key] = make()
        return t

    def server_template(self, svc: Service, method: str, route: str) -> Span:
        attrs = [
            _kv("http.request.method", method),
            _kv("http.route", route),
            _kv("url.scheme", "http"),
            _kv("server.address", f"{svc.name}.shop.svc"),
            _kv("server.port", 8080),
            _kv("network.protocol.version", "1.1"),
            _kv("client.address", "10.0.3.17"),
        ]
        if svc.name == "frontend":
            attrs.append(_kv("user_agent.original", "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101"))
        return self._template(
            ("server", svc.name, method, route),
            lambda: Span(name=f"{method} {route}", kind=Span.SPAN_KIND_SERVER, attributes=attrs),
        )

    def handler_template(self, svc: Service, route: str, line: int) -> Span:
        function = f"{svc.handler}.{route.strip('/').split('/')[0] or 'index'}"
        return self._template(
            ("handler", svc.name, route),
            lambda: Span(
                name=function.rsplit(".", 1)[-1],
                kind=Span.SPAN_KIND_INTERNAL,
                attributes=[]
                if self.stock
                else [
                    _kv("code.function.name", function),
                    _kv("code.file.path", f"/srv/{svc.file}"),
                    _kv("code.line.number", line),
                ],
            ),
        )

    def client_template(self, callee: Service, method: str) -> Span:
        return self._template(
            ("client", callee.name, method),
            lambda: Span(
                name=method,
                kind=Span.SPAN_KIND_CLIENT,
                attributes=[
                    _kv("http.request.method", method),
                    _kv("server.address", f"{callee.name}.shop.svc"),
                    _kv("server.port", 8080),
                    _kv("network.protocol.version", "1.1"),
                ],
            ),
        )

    def db_template(self, st: Statement) -> Span:
        return self._template(
            ("db", st.text),
            lambda: Span(
                name=f"{st.operation} {st.table}",
                kind=Span.SPAN_KIND_CLIENT,
                attributes=[
                    _kv("db.system.name", "postgresql"),
                    _kv("db.namespace", "shop"),
                    _kv("db.collection.name", st.table),
                    _kv("db.operation.name", st.operation),
                    _kv("db.query.text", st.text),
                    _kv("server.address", "pg.shop.svc"),
                    _kv("server.port", 5432),
                    _kv("network.peer.address", "10.0.9.4"),
                ],
            ),
        )

    # -- one trace ------------------------------------------------------------------------------------------------
    def trace(self, start_ns: int) -> list[_Spec]:
        rng = self.rng
        trace_id = rng.randbytes(16)
        spans: list[_Spec] = []
        self._serve(SERVICES["frontend"], trace_id, None, start_ns, spans)
        if rng.random() < ERROR_PROBABILITY:
            self._fail(spans)
        return spans

    def _serve(self, svc: Service, trace_id: bytes, client: _Spec | None, start: int, out: list[_Spec]) -> int:
        """A SERVER span of ``svc`` (and everything under it) starting at ``start``; returns its end."""
        rng = self.rng
        method, route = rng.choice(svc.routes)
        resource = rng.choice(self.instances[svc.name])
        server = _Spec(
            self.server_template(svc, method, route),
            resource,
            SERVER_SCOPE,
            trace_id,
            rng.randbytes(8),
            client.span_id if client else b"",
            start,
            0,
            200,
            (("url.path", route.replace("{id}", str(rng.randint(1, 99_999))).replace("{sku}", "SKU-00042")),),
            parent=client,
        )
        t = start + rng.randint(40, 250) * US
        handler = _Spec(
            self.handler_template(svc, route, 20 + 7 * len(route)),
            resource,
            APP_SCOPE,
            trace_id,
            rng.randbytes(8),
            server.span_id,
            t,
            0,
            parent=server,
        )
        out += (server, handler)
        t += rng.randint(20, 120) * US
        steps: list[str | Statement] = [callee for callee, p in svc.downstream if rng.random() < p]
        if svc.statements and rng.random() < DB_PROBABILITY:
            steps.insert(rng.randint(0, len(steps)), rng.choice(svc.statements))
        for step in steps:
            if isinstance(step, Statement):
                duration = int(rng.lognormvariate(0.0, 0.8) * 0.8 * MS)
                params = repr(step.params(rng))
                out.append(
                    _Spec(
                        self.db_template(step),
                        resource,
                        DB_SCOPE,
                        trace_id,
                        rng.randbytes(8),
                        handler.span_id,
                        t,
                        t + duration,
                        text=() if self.stock else (("db.statement.parameters", params),),
                        parent=handler,
                    )
                )
                t += duration
            else:
                callee = SERVICES[step]
                call_method = "POST" if rng.random() < 0.6 else "GET"
                call = _Spec(
                    self.client_template(callee, call_method),
                    resource,
                    HTTP_SCOPE,
                    trace_id,
                    rng.randbytes(8),
                    handler.span_id,
                    t,
                    0,
                    200,
                    (("url.full", f"http://{callee.name}.shop.svc:8080/api/v1/{rng.randint(1, 99_999)}"),),
                    parent=handler,
                )
                out.append(call)
                callee_end = self._serve(callee, trace_id, call, t + rng.randint(150, 600) * US, out)
                call.end_ns = callee_end + rng.randint(100, 400) * US
                t = call.end_ns
            t += rng.randint(10, 300) * US
        t += int(rng.expovariate(1 / (2 * MS)))  # the handler's own work
        handler.end_ns = t
        server.end_ns = t + rng.randint(30, 150) * US
        return server.end_ns

    def _fail(self, spans: list[_Spec]) -> None:
        """Fail the handler of a random SERVER span: exception event there, ERROR/500 up to the root."""
        rng = self.rng
        servers = [s for s in spans if s.template.kind == Span.SPAN_KIND_SERVER]
        failing = rng.choice(servers)
        handler = next(s for s in spans if s.parent is failing)
        handler.error = True
        handler.exception = rng.choice(EXCEPTIONS)
        node: _Spec | None = failing
        while node is not None:
            node.error = True
            if node.http_status:
                node.http_status = 500
            node = node.parent


def _encode(builder: _Builder, specs: list[_Spec]) -> bytes:
    """One ``TracesData`` message: spans grouped by resource, then by scope, in first-seen order."""
    groups: dict[int, dict[int, list[_Spec]]] = {}
    for s in specs:
        groups.setdefault(s.resource, {}).setdefault(s.scope, []).append(s)
    msg = TracesData()
    for resource, by_scope in groups.items():
        rs = msg.resource_spans.add()
        rs.resource.CopyFrom(builder.resources[resource])
        rs.schema_url = SCHEMA_URL
        for scope, members in by_scope.items():
            ss = rs.scope_spans.add()
            ss.scope.CopyFrom(builder.scopes[scope])
            ss.schema_url = SCHEMA_URL
            for s in members:
                sp = ss.spans.add()
                sp.CopyFrom(s.template)
                sp.trace_id = s.trace_id
                sp.span_id = s.span_id
                if s.parent_id:
                    sp.parent_span_id = s.parent_id
                sp.start_time_unix_nano = s.start_ns
                sp.end_time_unix_nano = s.end_ns
                sp.flags = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, as the Python SDK sets
                for key, text in s.text:
                    kv = sp.attributes.add()
                    kv.key = key
                    kv.value.string_value = text
                if s.http_status:
                    kv = sp.attributes.add()
                    kv.key = "http.response.status_code"
                    kv.value.int_value = s.http_status
                if s.error:
                    sp.status.code = Status.STATUS_CODE_ERROR
                    if s.http_status:
                        sp.attributes.add(key="error.type", value=AnyValue(string_value=str(s.http_status)))
                if s.exception is not None:
                    exc_type, exc_message = s.exception
                    sp.status.message = f"{exc_type}: {exc_message}"
                    ev = sp.events.add()
                    ev.name = "exception"
                    ev.time_unix_nano = s.end_ns - 1_000
                    ev.attributes.extend(
                        [
                            _kv("exception.type", exc_type),
                            _kv("exception.message", exc_message),
                            _kv(
                                "exception.stacktrace",
                                f'Traceback (most recent call last):\n  File "/srv/app.py", line 88, in handle\n'
                                f"{exc_type}: {exc_message}\n",
                            ),
                            _kv("exception.escaped", False),
                        ]
                    )
    return msg.SerializeToString()


def _spans_by_end(
    builder: _Builder, n_spans: int, start_ns: int, traces_per_s: float, out: Generated
) -> Iterator[_Spec]:
    """Spans of fresh traces in the order they end, until at least ``n_spans`` (whole traces only)."""
    rng = builder.rng
    pending: list[tuple[int, int, _Spec]] = []
    seq = 0
    t = start_ns
    out.start_ns = start_ns
    while out.spans < n_spans:
        # Every span still to come ends after ``t``: whatever ended before is complete and in order.
        while pending and pending[0][0] <= t:
            yield heapq.heappop(pending)[2]
        spans = builder.trace(t)
        out.traces += 1
        out.spans += len(spans)
        out.db_spans += sum(1 for s in spans if s.scope == DB_SCOPE)
        out.error_traces += any(s.error for s in spans)
        for s in spans:
            heapq.heappush(pending, (s.end_ns, seq, s))
            seq += 1
            out.end_ns = max(out.end_ns, s.end_ns)
        t += max(1, int(rng.expovariate(traces_per_s) * 1e9))
    while pending:
        yield heapq.heappop(pending)[2]


def partition_of(trace_id: bytes, partitions: int) -> int:
    """The partition every span of a trace goes to."""
    return int.from_bytes(trace_id[-8:], "big") % partitions


def generate_run(
    n_spans: int,
    spans_per_message: int = 300,
    seed: int = 0,
    *,
    start_ns: int | None = None,
    traces_per_s: float = 5_000.0,
    partitions: int = 1,
    shape: str = "bench",
    stock: bool = False,
) -> Generated:
    """At least ``n_spans`` spans (whole traces) in messages of ``spans_per_message``, with their counts.

    ``start_ns`` defaults to now; pass it to get byte-identical output for the same seed. ``partitions``: see the
    module docstring (1: one stream of messages, all on partition 0). ``shape``: ``bench`` (messages of exactly
    ``spans_per_message`` spans per partition) or ``collector`` (one trace per message; see the module docstring).
    The same seed gives the same spans in either shape. ``stock``: the spans as stock instrumentation sends them by
    default (DB spans without ``db.statement.parameters``, handler spans without ``code.*``), otherwise the same.
    """
    if spans_per_message < 1:
        raise ValueError("spans_per_message must be positive")
    if partitions < 1:
        raise ValueError("partitions must be positive")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}")
    rng = random.Random(seed)
    builder = _Builder(rng, stock)
    out = Generated()
    begin = time.time_ns() if start_ns is None else start_ns
    if shape == "collector":
        return _collector_shaped(builder, out, n_spans, spans_per_message, begin, traces_per_s, partitions)
    batches: list[list[_Spec]] = [[] for _ in range(partitions)]

    def flush(partition: int) -> None:
        batch = batches[partition]
        out.messages.append(_encode(builder, batch))
        out.span_counts.append(len(batch))
        out.partitions.append(partition)
        batches[partition] = []

    for spec in _spans_by_end(builder, n_spans, begin, traces_per_s, out):
        partition = partition_of(spec.trace_id, partitions) if partitions > 1 else 0
        batches[partition].append(spec)
        if len(batches[partition]) == spans_per_message:
            flush(partition)
    for partition, batch in enumerate(batches):
        if batch:
            flush(partition)
    return out


def _collector_shaped(
    builder: _Builder, out: Generated, n_spans: int, batch_size: int, begin: int, traces_per_s: float, partitions: int
) -> Generated:
    """The collector shape: batches of ``batch_size`` spans, each split by resource, scope and trace id."""
    batch: list[_Spec] = []

    def flush() -> None:
        groups: dict[tuple[int, int, bytes], list[_Spec]] = {}
        for s in batch:
            groups.setdefault((s.resource, s.scope, s.trace_id), []).append(s)
        for (_, _, trace_id), specs in groups.items():
            out.messages.append(_encode(builder, specs))
            out.span_counts.append(len(specs))
            out.partitions.append(partition_of(trace_id, partitions) if partitions > 1 else 0)
            out.keys.append(trace_id.hex().encode())
        batch.clear()

    for spec in _spans_by_end(builder, n_spans, begin, traces_per_s, out):
        batch.append(spec)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return out


def generate(n_spans: int, spans_per_message: int = 300, seed: int = 0, *, start_ns: int | None = None) -> list[bytes]:
    """Encoded ``TracesData`` messages holding at least ``n_spans`` spans; see :func:`generate_run`."""
    return generate_run(n_spans, spans_per_message, seed, start_ns=start_ns).messages
