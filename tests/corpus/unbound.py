"""Recorded corpus fixtures as services with stock instrumentation send them: no statement parameters.

The corpus records its services with ``capture_parameters=True``; the stock psycopg/psycopg2/dbapi
instrumentations default to ``False`` (and the SQLAlchemy instrumentation and the Java agent record none). This
takes every ``db.statement.parameters`` / ``db.query.parameter.*`` attribute out of the recorded OTLP spans, so
the same race is replayed as the daemon would see it from a service nobody tuned.
"""

from __future__ import annotations

from dataclasses import replace

from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench.corpus.recorder import Message
from tests.corpus.replay import Fixture

PARAMETER_KEYS = ("db.statement.parameters", "db.query.parameter.")


def _is_parameter(key: str) -> bool:
    return key == PARAMETER_KEYS[0] or key.startswith(PARAMETER_KEYS[1])


def without_parameters(message: Message, spans_topic: str) -> Message:
    """The message with no statement parameter on any span (other topics' messages as they are)."""
    if message.topic != spans_topic or message.value is None:
        return message
    data = TracesData.FromString(message.value)
    for resource_spans in data.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                kept = [kv for kv in span.attributes if not _is_parameter(kv.key)]
                del span.attributes[:]
                span.attributes.extend(kept)
    return replace(message, value=data.SerializeToString())


def unbound(fixture: Fixture) -> Fixture:
    """The fixture as a service recording no statement parameters would have produced it."""
    topic = fixture.manifest.spans_topic
    return Fixture(fixture.manifest, [without_parameters(m, topic) for m in fixture.messages])
