"""From sampled records to the report: decode with the daemon's decoders, sum up per service and table, find.

A message the daemon would dead-letter is counted by the reason the daemon would give (the decoder's, or
``internal_error:<type>``) and named in the report; the rest of the sample is still read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from processors.api.telemetry import Telemetry
from processors.model.events import RowChange
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from streamer.config import CoreSettings
from streamer.decode import DECODERS, DecodeError, Record
from streamer.decode.errors import DecodeUnavailable
from streamer.doctor import services, tables
from streamer.doctor.report import Report
from streamer.doctor.wire import WireCensus


def diagnose(records: Sequence[Record], settings: CoreSettings, notes: Sequence[str] = ()) -> Report:
    """The report on ``records`` (spans, logs and CDC topics as ``settings.kafka`` names them)."""
    kafka = settings.kafka
    telemetry = Telemetry("doctor")
    decode_spans = DECODERS[f"{kafka.span_encoding}.traces"](settings.decode, telemetry)
    decode_logs = DECODERS[f"{kafka.span_encoding}.logs"](settings.decode, telemetry)
    decode_change = DECODERS["debezium"](settings.decode, telemetry)
    notes = list(notes)
    if settings.decode.schema_registry.url:  # Avro changes: the schemas they name, from the registry first
        try:
            asyncio.run(decode_change.prepare([r for r in records if r.topic not in (kafka.spans_topic,  # type: ignore[attr-defined]
                                                                                     kafka.logs_topic)]))  # fmt: skip
        except DecodeUnavailable as exc:
            notes.append(f"Avro changes not read: {exc}")
    sql = settings.sql
    extractor = SqlAccessExtractor(sql.key_columns, sql.version_columns, sql.insert_identity,
                                   sql.statement_cache, max_tables=sql.max_tables)  # fmt: skip
    report = Report(notes=notes)
    wire, cdc = WireCensus(), tables.TableCensus()
    spans: list[Span] = []
    for r in records:
        report.topics[r.topic] = report.topics.get(r.topic, 0) + 1
        try:
            if r.topic == kafka.spans_topic:
                spans += decode_spans(r)
                if r.value:
                    (wire.add_json if kafka.span_encoding == "otlp_json" else wire.add_proto)(r.value)
            elif r.topic == kafka.logs_topic:
                decode_logs(r)
            else:
                changes = decode_change(r)
                change = changes[0] if changes and isinstance(changes[0], RowChange) else None
                if change is not None:
                    extractor.keys.learn(change)  # as stage 1 does: the keys come from the row changes
                cdc.add(r.topic, r.value, change)
        except Exception as exc:  # as the daemon would dead-letter it: a decoder's reason, or internal_error:<type>
            reason = exc.reason if isinstance(exc, DecodeError) else f"internal_error:{type(exc).__name__}"
            reasons = report.undecodable.setdefault(r.topic, {})
            reasons[reason] = reasons.get(reason, 0) + 1
            if r.topic not in (kafka.spans_topic, kafka.logs_topic):
                cdc.add(r.topic, r.value, None)
    census = services.ServiceCensus(extractor)
    for span in spans:
        census.add(span)
    for name, stats in sorted(census.services.items()):
        report.findings += services.findings(name, stats, wire.services.get(name), settings.codeloc)
    subjects: dict[str, str] = {}
    for topic, table in sorted(cdc.topics.items()):
        found = tables.findings(topic, table, report.undecodable.get(topic, {}), settings.correlation.trace_column)
        report.findings += found
        if table.table:
            subjects[table.table.rsplit(".", 1)[-1]] = found[0].subject
    report.findings += services.table_parameters(census, subjects)
    written = {name: s.written for name, s in census.services.items() if s.written}
    report.findings += tables.uncaptured(written, list(cdc.topics.values()))
    return report
