"""The doctor's findings from fixed decoded spans, row changes and raw messages (no engine)."""

from __future__ import annotations

import json

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, TracesData
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from processors.codeloc import CodeLocConfig
from processors.model.events import CdcOp, DbCall, Resource, RowChange, SpanKind, StatusCode
from processors.model.span import Span
from streamer import config
from streamer.decode import Record
from streamer.doctor import fixes, services, tables
from streamer.doctor.diagnose import diagnose
from streamer.doctor.report import Finding, Report, Status
from streamer.doctor.wire import WireCensus, WireFacts, threshold

NO_CHECKOUT = CodeLocConfig()


def _span(statement: str = "", params: tuple[object, ...] = (), *, version: str = "1.0", kind: SpanKind =
          SpanKind.CLIENT, route: str = "", service: str = "shop") -> Span:  # fmt: skip
    db = DbCall("postgresql", statement, params=params) if statement else None  # type: ignore[arg-type]
    return Span("a" * 32, "b" * 16, "", "s", kind, 1, 2, StatusCode.UNSET, Resource(service, version), route=route,
                db=db)  # fmt: skip


def _by_capability(found: list[Finding]) -> dict[str, Finding]:
    return {f.capability: f for f in found}


def test_unbound_statements_are_missing_parameters_with_the_python_fix() -> None:
    """Statements whose placeholders' values the spans lack: missing, counted, tables named, psycopg's option."""
    census = services.ServiceCensus()
    census.add(_span("UPDATE orders SET status = %s WHERE id = %s"))
    census.add(_span("INSERT INTO charges (order_id, amount) VALUES (%s, %s)"))
    census.add(_span("SELECT 1"))  # no row access: not a statement that counts
    found = _by_capability(services.findings("shop", census.services["shop"], WireFacts(language="python"),
                                             NO_CHECKOUT))  # fmt: skip
    params = found["collisions: statement parameters"]
    assert params.status is Status.MISSING
    assert params.detail.startswith("2 of 2 statement(s) carry no parameter values (")
    assert "orders" in params.detail and "charges" in params.detail
    assert params.fix == fixes.PARAMETERS["python"] and "capture_parameters=True" in params.fix
    per_table = {f.subject: f for f in services.table_parameters(census, {"orders": "table public.orders (t)"})}
    assert per_table["table public.orders (t)"].status is Status.MISSING
    assert per_table["table public.orders (t)"].detail.startswith("1 of 1 statement(s) on it carry no parameter")
    assert per_table["table charges"].status is Status.MISSING


def test_bound_statements_are_ok_and_a_mix_is_partial() -> None:
    """Every statement with its values: ok; some without: partial (the count says how many)."""
    census = services.ServiceCensus()
    census.add(_span("UPDATE orders SET status = %s WHERE id = %s", ("paid", 8812)))
    ok = _by_capability(services.findings("shop", census.services["shop"], None, NO_CHECKOUT))
    assert ok["collisions: statement parameters"].status is Status.OK
    census.add(_span("UPDATE orders SET status = %s WHERE id = %s"))
    mixed = _by_capability(services.findings("shop", census.services["shop"], None, NO_CHECKOUT))
    assert mixed["collisions: statement parameters"].status is Status.PARTIAL
    assert mixed["collisions: statement parameters"].detail.startswith("1 of 2 statement(s)")


def test_unknown_language_gets_every_languages_fix_and_sqlalchemy_its_own() -> None:
    """No telemetry.sdk.language: the fix names Python, Java, Node and Go; SQLAlchemy alone: instrument the driver."""
    census = services.ServiceCensus()
    census.add(_span("DELETE FROM orders WHERE id = $1"))
    stats = census.services["shop"]
    fix = _by_capability(services.findings("shop", stats, None, NO_CHECKOUT))["collisions: statement parameters"].fix
    assert "capture-query-parameters=true" in fix and "enhancedDatabaseReporting" in fix
    assert "WithAttributesGetter" in fix and "capture_parameters=True" in fix
    wire = WireFacts(language="python", scopes={"opentelemetry.instrumentation.sqlalchemy"})
    fix = _by_capability(services.findings("shop", stats, wire, NO_CHECKOUT))["collisions: statement parameters"].fix
    assert fix == fixes.PARAMETERS_SQLALCHEMY


def test_version_routes_and_code_location() -> None:
    """No service.version: missing; server spans without http.route: missing; no code.* and no checkout: missing,
    but ok with a [codeloc] checkout of the service."""
    census = services.ServiceCensus()
    census.add(_span(version="", kind=SpanKind.SERVER))
    census.add(_span(version="", kind=SpanKind.SERVER, route="/orders/{id}"))
    stats = census.services["shop"]
    found = _by_capability(services.findings("shop", stats, WireFacts(language="java"), NO_CHECKOUT))
    assert found["regressions, verdicts: service.version"].status is Status.MISSING
    assert found["routes: http.route"].status is Status.PARTIAL
    assert found["routes: http.route"].detail == "1 of 2 server span(s) carry http.route"
    assert found["routes: http.route"].fix == fixes.ROUTES["java"]
    assert found["repairs: code location"].status is Status.MISSING
    checkout = CodeLocConfig(services={"shop": "/src/shop"})
    assert (
        _by_capability(services.findings("shop", stats, None, checkout))["repairs: code location"].status is Status.OK
    )


def _change(op: CdcOp, before: dict[str, object] | None, after: dict[str, object] | None) -> RowChange:
    return RowChange("public.orders", op, (("id", 1),), before, after, 0, 0, 0, "")


def test_before_images_missing_without_replica_identity_full() -> None:
    """An update with no before image and a delete whose before holds only the key: REPLICA IDENTITY is not FULL."""
    census = tables.TableCensus()
    census.add("cdc.public.orders", None, _change(CdcOp.UPDATE, None, {"id": 1, "status": "paid"}))
    census.add("cdc.public.orders", None, _change(CdcOp.DELETE, {"id": 1, "status": None}, None))
    census.add("cdc.public.orders", None, _change(CdcOp.CREATE, None, {"id": 2, "status": "new", "trace_id": "x"}))
    found = _by_capability(tables.findings("cdc.public.orders", census.topics["cdc.public.orders"], {}, "trace_id"))
    before = found["cdc: before images"]
    assert before.status is Status.MISSING
    assert before.detail.startswith("2 of 2 update(s)/delete(s) without a full before image (1 none, 1 key only)")
    assert before.fix == "ALTER TABLE public.orders REPLICA IDENTITY FULL (the before image then carries every column)"
    assert found["cdc: trace column"].status is Status.OK


def test_converter_form_schemas_and_precise_decimals() -> None:
    """Raw values say the converter's form and schemas; a precise decimal still text after decoding is partial."""
    schema = {"type": "struct", "fields": [{"type": "struct", "field": "after", "fields": [
        {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "field": "price"}]}]}  # fmt: skip
    payload = {"op": "c", "source": {"table": "items", "schema": "public"}, "before": None,
               "after": {"id": 1, "price": "AZA="}}  # fmt: skip
    value = json.dumps({"schema": schema, "payload": payload}).encode()
    census = tables.TableCensus()
    change = RowChange("public.items", CdcOp.CREATE, (("id", 1),), None, {"id": 1, "price": "AZA="}, 0, 0, 0, "")
    census.add("t", value, change)
    found = _by_capability(tables.findings("t", census.topics["t"], {}, "trace_id"))
    assert found["cdc: converter form"].detail == "Debezium envelope (JSON) x1; schemas on"
    assert found["cdc: decimals"].status is Status.PARTIAL and "(price)" in found["cdc: decimals"].detail
    unwrapped = json.dumps({"id": 1, "price": 3}).encode()
    assert tables._form(unwrapped)[0] == "unwrapped"
    census.add("u", unwrapped, RowChange("public.items", CdcOp.UPDATE, (("id", 1),), None, {"id": 1}, 0, 0, 0, ""))
    before = _by_capability(tables.findings("u", census.topics["u"], {}, "trace_id"))["cdc: before images"]
    assert before.status is Status.MISSING and "unwrapped rows carry no before image" in before.detail
    assert tables._form(b"\x00\x00\x00\x00\x07\x02abc")[0] == "registry"


def _traces(trace_state: str, language: str = "go") -> bytes:
    def kv(k: str, v: str) -> KeyValue:
        return KeyValue(key=k, value=AnyValue(string_value=v))

    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=[ProtoSpan(trace_id=b"\x01" * 16, span_id=b"\x02" * 8,
                                                                name="q", trace_state=trace_state)])])  # fmt: skip
    rs.resource.attributes.extend([kv("service.name", "api"), kv("telemetry.sdk.language", language)])
    return TracesData(resource_spans=[rs]).SerializeToString()


def test_sampling_threshold_from_tracestate() -> None:
    """A W3C tracestate OpenTelemetry threshold is read per service; none at all is partial."""
    assert threshold("vendor=x,ot=rv:abc;th:8") == "8" and threshold("ot=rv:abc") == ""
    wire = WireCensus()
    wire.add_proto(_traces("ot=th:c"))
    wire.add_proto(b"\xff not protobuf")  # the decoder dead-letters it; the census adds nothing
    facts = wire.services["api"]
    assert facts.language == "go" and facts.with_threshold == 1
    census = services.ServiceCensus()
    census.add(_span(service="api"))
    found = _by_capability(services.findings("api", census.services["api"], facts, NO_CHECKOUT))
    assert found["sampling: threshold or sampler"].status is Status.OK
    assert "ot=th:c" in found["sampling: threshold or sampler"].detail


def test_diagnose_counts_undecodable_cdc_and_uncaptured_written_tables() -> None:
    """Through the daemon's decoders: a CDC message that is no Debezium JSON is named with the decoder's reason, and a
    table the spans write that no CDC topic carries is missing with the capture fix."""
    settings = config.load(None, env={"TRACE_REPRO_KAFKA__CDC_PATTERN": "^cdc\\."})
    records = [Record("cdc.public.items", 0, 0, b'{"id":1}', b"not json"),
               Record("otlp_spans", 0, 0, None, _traces("", "python")),
               Record("otlp_spans", 0, 1, None, b"\xff\xff not protobuf")]  # fmt: skip
    report = diagnose(records, settings)
    assert report.topics == {"cdc.public.items": 1, "otlp_spans": 2}
    assert report.undecodable["cdc.public.items"] == {"debezium_invalid_json": 1}
    assert sum(report.undecodable["otlp_spans"].values()) == 1  # counted, the rest of the sample read
    form = report.for_subject("table ? (cdc.public.items)")[0]
    assert form.capability == "cdc: converter form" and form.status is Status.MISSING
    census = services.ServiceCensus()
    census.add(_span("UPDATE stock SET n = n - 1 WHERE sku = 'a'"))
    missing = tables.uncaptured({"shop": census.services["shop"].written}, [])
    assert [(f.subject, f.status) for f in missing] == [("table stock", Status.MISSING)]
    assert missing[0].fix == fixes.CDC_CAPTURE


def test_report_renders_a_table_and_json() -> None:
    """The table shows each finding's status and, when not ok, its fix; the JSON holds every field."""
    report = Report(topics={"otlp_spans": 3}, findings=[
        Finding("service shop", "a", Status.MISSING, "seen", "turn it on"),
        Finding("service shop", "b", Status.OK, "fine", "never shown")])  # fmt: skip
    table = report.to_table()
    assert "MISSING  seen" in table and "fix: turn it on" in table and "never shown" not in table
    assert json.loads(report.to_json())["findings"][0] == {
        "subject": "service shop",
        "capability": "a",
        "status": "missing",
        "detail": "seen",
        "fix": "turn it on",
    }
