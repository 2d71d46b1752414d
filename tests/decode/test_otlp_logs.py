"""OTLP logs decoding: records made by the real OpenTelemetry SDK, encoded by its own OTLP encoder."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import TracerProvider

from processors.model.events import LogRecord, Resource
from streamer.decode import DecodeError, DecodeOptions, DecodeStats, decode_logs_json, decode_logs_proto

_LOUD = b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": "LOUD"}]}]}]}'
CHECKOUT = Resource(service="checkout", version="1.4.2", environment="prod", revision="9f1c2e7")


def _logs_request() -> tuple[Any, str, str]:
    """An ExportLogsServiceRequest of three SDK log records, and the trace/span id the first one carries."""
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider(
        resource=SdkResource.create(
            {
                "service.name": "checkout",
                "service.version": "1.4.2",
                "deployment.environment.name": "prod",
                "vcs.ref.head.revision": "9f1c2e7",
            }
        )
    )
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("tests.decode")
    tracer = TracerProvider().get_tracer("tests.decode")  # only to give the first record a trace context
    with tracer.start_as_current_span("POST /orders/{id}/pay") as span:
        try:
            raise KeyError("card")
        except KeyError as exc:
            logger.emit(
                timestamp=1_700_000_000_000_000_000,
                severity_number=SeverityNumber.ERROR,
                severity_text="ERROR",
                body="payment failed",
                attributes={"order.id": 8812},
                event_name="payment.failed",
                exception=exc,
            )
    logger.emit(body={"order": [8812, "paid"]}, severity_number=SeverityNumber.INFO2, attributes={"event.name": "x"})
    logger.emit(body=42)
    ctx = span.get_span_context()
    return encode_logs(exporter.get_finished_logs()), format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _collector_json(message: Any) -> bytes:
    """OTLP/JSON as the collector's ``otlp_json`` writes it: hex trace and span ids."""
    doc = MessageToDict(message)
    for resource_logs in doc["resourceLogs"]:
        for scope_logs in resource_logs["scopeLogs"]:
            for record in scope_logs["logRecords"]:
                for key in ("traceId", "spanId"):
                    if key in record:
                        record[key] = base64.b64decode(record[key]).hex()
    return json.dumps(doc).encode()


def test_proto_decodes_every_field() -> None:
    """Time, severity, body (string and structured), event name, ids and exception type are decoded."""
    request, trace_id, span_id = _logs_request()
    stats = DecodeStats()
    first, second, third = decode_logs_proto(request.SerializeToString(), DecodeOptions(), stats)
    assert stats.log_records == 3
    assert first == LogRecord(
        time_ns=1_700_000_000_000_000_000,
        resource=CHECKOUT,
        severity_number=SeverityNumber.ERROR.value,
        severity_text="ERROR",
        body="payment failed",
        event_name="payment.failed",
        trace_id=trace_id,
        span_id=span_id,
        exception_type="KeyError",
    )
    observed = request.resource_logs[0].scope_logs[0].log_records[1].observed_time_unix_nano
    assert second == LogRecord(
        time_ns=observed,  # no timestamp: the observed time is used
        resource=CHECKOUT,
        severity_number=SeverityNumber.INFO2.value,
        severity_text="",
        body='{"order":[8812,"paid"]}',
        event_name="x",  # from the event.name attribute
    )
    assert third.body == "42"
    assert (third.trace_id, third.span_id, third.event_name) == ("", "", "")


def test_json_matches_proto() -> None:
    """The collector's otlp_json (hex ids, enum names) decodes to exactly the records the protobuf gives."""
    request, _, _ = _logs_request()
    assert decode_logs_json(_collector_json(request)) == decode_logs_proto(request.SerializeToString())


def test_json_numeric_severity_and_snake_case() -> None:
    """Severity as a number and snake_case keys are accepted."""
    doc = {
        "resource_logs": [
            {
                "scope_logs": [
                    {
                        "log_records": [
                            {
                                "time_unix_nano": "5",
                                "severity_number": 17,
                                "body": {"string_value": "boom"},
                                "trace_id": "ab" * 16,
                                "span_id": "",
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (record,) = decode_logs_json(json.dumps(doc).encode())
    assert record == LogRecord(
        time_ns=5, resource=Resource(service=""), severity_number=17, severity_text="", body="boom", trace_id="ab" * 16
    )


def test_bad_ids_rejected() -> None:
    """A log record whose trace id has the wrong length is an otlp_invalid_id error in both encodings."""
    msg = logs_pb2.LogsData()
    msg.resource_logs.add().scope_logs.add().log_records.add(trace_id=b"\x01" * 8, body={"string_value": "x"})
    with pytest.raises(DecodeError) as err:
        decode_logs_proto(msg.SerializeToString())
    assert err.value.reason == "otlp_invalid_id"
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": base64.b64encode(b"\x01" * 16).decode()}]}]}]}
    with pytest.raises(DecodeError) as err:
        decode_logs_json(json.dumps(doc).encode())
    assert err.value.reason == "otlp_invalid_id"


@pytest.mark.parametrize(
    ("decode", "data", "reason"),
    [
        (decode_logs_proto, b"", "empty_value"),
        (decode_logs_proto, b"\xff" * 16, "otlp_proto_invalid"),
        (decode_logs_json, b"", "empty_value"),
        (decode_logs_json, b"{", "otlp_json_invalid"),
        (
            decode_logs_json,
            b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": "LOUD"}]}]}]}',
            "otlp_json_invalid",
        ),
    ],
)
def test_malformed_rejected(decode: Any, data: bytes, reason: str) -> None:
    """Empty, corrupt or ill-typed log messages raise DecodeError with the matching reason."""
    with pytest.raises(DecodeError) as err:
        decode(data)
    assert err.value.reason == reason


def test_long_body_truncated() -> None:
    """A body over max_attribute_bytes is cut and counted."""
    msg = logs_pb2.LogsData()
    msg.resource_logs.add().scope_logs.add().log_records.add(body={"string_value": "z" * 500})
    stats = DecodeStats()
    (record,) = decode_logs_proto(msg.SerializeToString(), DecodeOptions(max_attribute_bytes=100), stats)
    assert record.body == "z" * 100
    assert stats.truncated_attributes == 1
