"""The ``[kafka]`` client surface on the real broker: every codec read, the start policy of a new group, the
topics the daemon creates (or expects), the original headers on dead letters, secrets kept out of sight."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError
from aiokafka.record.default_records import DefaultRecordBatch

from sinks.kafka import KafkaSink, Message
from sinks.kafka.client import OAuthToken, client_kwargs
from sinks.kafka.config import KafkaConfig
from streamer import config
from streamer.runtime.topics import MissingTopics, create_topics, ensure_topics
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, ids, to_proto

CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"gzip": DefaultRecordBatch.CODEC_GZIP, "snappy": DefaultRecordBatch.CODEC_SNAPPY,
             "lz4": DefaultRecordBatch.CODEC_LZ4, "zstd": DefaultRecordBatch.CODEC_ZSTD}  # fmt: skip


def _harness(kafka_bootstrap: str, falkordb_url: str, **overrides: str) -> Harness:
    settings = harness_settings(kafka_bootstrap, falkordb_url, graph_policy__detail="all", **overrides)
    return Harness(settings, kafka_bootstrap, falkordb_url)


def _trace(route: str) -> tuple[str, bytes]:
    """One request's spans as one OTLP message, with its trace id."""
    shop = ShopTelemetry()
    shop.request(route, function="handler", start_ns=time.time_ns())
    spans = shop.take()
    (trace_id,), _ = ids(spans)
    return trace_id, to_proto(spans)


def _traces(harness: Harness) -> set[str]:
    return {row[0] for row in harness.graph_rows("MATCH (t:Trace) RETURN t.id")}


@pytest.mark.engines
async def test_every_codec_is_read_by_the_ingest_stage(kafka_bootstrap: str, falkordb_url: str) -> None:
    """Span messages produced with gzip, snappy, lz4 and zstd (a collector's choice) all reach the graph."""
    harness = _harness(kafka_bootstrap, falkordb_url)
    sent = {codec: _trace(f"/{codec}") for codec in CODECS}
    await harness.start()
    try:
        for codec, (_, value) in sent.items():
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type=codec)
            await producer.start()
            try:
                await producer.send_and_wait(harness.settings.kafka.spans_topic, value, key=codec.encode())
            finally:
                await producer.stop()
        want = {trace_id for trace_id, _ in sent.values()}
        await harness.wait_for(lambda: want <= _traces(harness), "a trace per codec in the graph")
        assert harness.metric_total("trace_repro_dropped_total") == 0
    finally:
        await harness.stop()


@pytest.mark.engines
@pytest.mark.parametrize("codec", ["zstd", "lz4"])
async def test_the_daemon_produces_with_its_compression_type(kafka_bootstrap: str, codec: str) -> None:
    """``compression_type``: what the daemon's Kafka sink sends is compressed with it, and read back intact."""
    topic = f"codec-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, {topic: 1})
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap, compression_type=codec))
    batch = sink._batch(topic)
    batch.append(key=b"k", value=b"x" * 5000, timestamp=None, headers=[])
    assert DefaultRecordBatch(bytes(batch._build())).compression_type == CODEC_IDS[codec]
    await sink.start()
    try:
        await sink.send([Message(topic, b"k", b"x" * 5000, (("h", b"1"),))])
    finally:
        await sink.close()
    got = await Harness(config.load(None, env={}), kafka_bootstrap, "").consume_all(topic, expect=1)
    assert [(m.value, list(m.headers)) for m in got] == [(b"x" * 5000, [("h", b"1")])]


def _consumed(harness: Harness, topic: str) -> float:
    """Messages of ``topic`` the daemon consumed."""
    assert harness.daemon is not None
    return sum(s.value for family in harness.daemon.metrics.registry.collect() for s in family.samples
               if s.name == "trace_repro_consumed_messages_total" and s.labels.get("topic") == topic)  # fmt: skip


async def _wait_fetching(harness: Harness) -> None:
    """Until the ingest stage has its position on the spans topic (a fetch answered): with ``latest`` it then
    reads whatever is produced from now on."""
    assert harness.daemon is not None
    [ingest] = [r for r in harness.daemon.runners if r.name == "ingest"]
    assert ingest.consumer is not None
    tp = TopicPartition(harness.settings.kafka.spans_topic, 0)
    await harness.wait_for(lambda: ingest.consumer is not None and ingest.consumer.highwater(tp) is not None,
                           "the ingest stage fetching the spans topic")  # fmt: skip


@pytest.mark.engines
@pytest.mark.parametrize("policy", ["latest", "earliest"])
async def test_a_new_group_starts_where_auto_offset_reset_says(kafka_bootstrap: str, falkordb_url: str,
                                                               policy: str) -> None:  # fmt: skip
    """A first start with ``latest`` reads only what comes after it; with ``earliest``, what was there before too."""
    harness = _harness(kafka_bootstrap, falkordb_url, kafka__auto_offset_reset=policy)
    k = harness.settings.kafka
    before, before_value = _trace("/before")
    after, after_value = _trace("/after")
    await harness.create_topics(k.spans_topic)
    await harness.produce(k.spans_topic, [before_value])
    await harness.start()
    try:
        await _wait_fetching(harness)
        await harness.produce(k.spans_topic, [after_value])
        await harness.wait_for(lambda: after in _traces(harness), "the trace produced after the start")
        consumed = _consumed(harness, k.spans_topic)  # (in offset order: the message before came first, if at all)
        assert consumed == (2 if policy == "earliest" else 1)
        await harness.wait_for(lambda: policy == "latest" or before in _traces(harness), "the trace from before")
        assert (before in _traces(harness)) == (policy == "earliest")
    finally:
        await harness.stop()


@pytest.mark.engines
async def test_with_latest_a_topic_created_after_the_start_is_read_from_its_beginning(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """``latest`` is for the group's first start only: a Debezium topic that appears later (a new table) is read
    from its first message, though that came before the daemon noticed the topic."""
    harness = _harness(kafka_bootstrap, falkordb_url, kafka__auto_offset_reset="latest")
    tag = harness.settings.kafka.group_id.rsplit("-", 1)[1]
    await harness.start()
    try:
        await _wait_fetching(harness)
        topic = f"cdc{tag}.public.refunds"  # (matches the harness's kafka.cdc_pattern)
        await harness.create_topics(topic)
        await harness.produce(topic, [b"first change", b"second change", b"third change"])
        await harness.wait_for(lambda: _consumed(harness, topic) >= 3, "the new topic read from its beginning")
    finally:
        await harness.stop()


def test_latest_is_the_default_and_documented() -> None:
    """The shipped default for a new group is ``latest``; the field says what each choice means."""
    field = KafkaConfig.model_fields["auto_offset_reset"]
    assert KafkaConfig().auto_offset_reset == "latest"
    assert field.description is not None and "earliest" in field.description


@pytest.mark.engines
async def test_create_topics_false_names_the_missing_topics(kafka_bootstrap: str) -> None:
    """With ``create_topics = false`` the daemon creates nothing: a missing topic is an error naming it; once the
    platform team created them all, the start goes on."""
    tag = uuid.uuid4().hex[:8]
    k = KafkaConfig(bootstrap=kafka_bootstrap, create_topics=False, accesses_topic=f"acc-{tag}", dlq_topic=f"dlq-{tag}",
                    incidents_topic=f"inc-{tag}", repros_topic=f"rep-{tag}", verdicts_topic=f"ver-{tag}")  # fmt: skip
    await create_topics(kafka_bootstrap, {f"acc-{tag}": 2, f"inc-{tag}": 1, f"rep-{tag}": 1})
    with pytest.raises(MissingTopics, match=f"dlq-{tag}, ver-{tag}") as raised:
        await ensure_topics(k)
    assert "create_topics" in str(raised.value)
    async with _admin(kafka_bootstrap) as admin:
        assert not {f"dlq-{tag}", f"ver-{tag}"} & set(await admin.list_topics())  # nothing created
    await create_topics(kafka_bootstrap, {f"dlq-{tag}": 1, f"ver-{tag}": 1})
    await ensure_topics(k)


@pytest.mark.engines
async def test_the_topics_it_creates_have_the_configured_partitions_and_retention(kafka_bootstrap: str) -> None:
    """``topic_partitions``, ``accesses_partitions``, ``retention_ms`` and ``replication_factor`` reach the broker
    (a replication factor the one-broker cluster cannot give is the broker's refusal, not silently 1)."""
    tag = uuid.uuid4().hex[:8]
    names = {"accesses_topic": f"acc-{tag}", "dlq_topic": f"dlq-{tag}", "incidents_topic": f"inc-{tag}",
             "repros_topic": f"rep-{tag}", "verdicts_topic": f"ver-{tag}"}  # fmt: skip
    k = KafkaConfig(bootstrap=kafka_bootstrap, topic_partitions=2, accesses_partitions=3, retention_ms=3_600_000,
                    **names)  # fmt: skip
    await ensure_topics(k)
    async with _admin(kafka_bootstrap) as admin:
        described = await admin.describe_topics(list(names.values()))
        partitions = {t["topic"]: len(t["partitions"]) for t in described}
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, f"inc-{tag}")])
    assert partitions == {f"acc-{tag}": 3, f"dlq-{tag}": 2, f"inc-{tag}": 2, f"rep-{tag}": 2, f"ver-{tag}": 2}
    retention = {entry[0]: entry[1] for entry in response.resources[0][4]}["retention.ms"]
    assert retention == "3600000"
    two = k.model_copy(update={"replication_factor": 2, "accesses_topic": f"acc2-{tag}"})
    with pytest.raises(InvalidReplicationFactorError):
        await ensure_topics(two)


@contextlib.asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


@pytest.mark.engines
async def test_dead_letters_keep_the_original_headers(kafka_bootstrap: str, falkordb_url: str) -> None:
    """An undecodable span message goes to the dead-letter topic with its own headers (a traceparent, a tenant),
    in their order, followed by the daemon's reason headers."""
    harness = _harness(kafka_bootstrap, falkordb_url)
    k = harness.settings.kafka
    original = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), ("tenant", b"acme"),
                ("tenant", b"second value kept too")]  # fmt: skip
    await harness.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(k.spans_topic, b"\xff not protobuf", key=b"bad", headers=original)
        finally:
            await producer.stop()
        [dead] = await harness.consume_all(k.dlq_topic, expect=1)
    finally:
        await harness.stop()
    headers = list(dead.headers)
    assert dead.value == b"\xff not protobuf"
    assert headers[: len(original)] == original
    names = [name for name, _ in headers[len(original) :]]
    assert names[:2] == ["reason", "component"] and "source.offset" in names


def test_secrets_stay_out_of_repr_dumps_and_files(tmp_path: Path) -> None:
    """The SASL and key passwords come from the environment and show in no repr, str or JSON dump of the
    settings; a config file holding one is refused, naming the variable to use instead."""
    env = {
        "TRACE_REPRO_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "TRACE_REPRO_KAFKA__SASL_USERNAME": "svc",
        "TRACE_REPRO_KAFKA__SASL_PASSWORD": "pw-Hunter2-sasl",
        "TRACE_REPRO_KAFKA__SSL_KEY_PASSWORD": "pw-key-0xC0",
    }
    settings = config.load(None, env=env)  # fmt: skip
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "pw-Hunter2-sasl"
    for shown in (repr(settings), str(settings), repr(settings.kafka), settings.model_dump_json()):
        assert "pw-Hunter2-sasl" not in shown and "pw-key-0xC0" not in shown
    path = tmp_path / "trace-repro.toml"
    path.write_text('[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_username = "svc"\nsasl_password = "in-a-file"\n')
    with pytest.raises(config.ConfigError, match="TRACE_REPRO_KAFKA__SASL_PASSWORD") as refused:
        config.load(path, env={})
    assert "in-a-file" not in str(refused.value)


def test_security_settings_that_cannot_work_fail_at_start() -> None:
    """SASL without a password, OAUTHBEARER without a token source, a certificate without its key: refused."""
    bad = [
        {"TRACE_REPRO_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "TRACE_REPRO_KAFKA__SASL_USERNAME": "svc"},
        {"TRACE_REPRO_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "TRACE_REPRO_KAFKA__SASL_MECHANISM": "OAUTHBEARER"},
        {"TRACE_REPRO_KAFKA__SECURITY_PROTOCOL": "SSL", "TRACE_REPRO_KAFKA__SSL_CERTFILE": "/etc/client.pem"},
        {"TRACE_REPRO_KAFKA__SECURITY_PROTOCOL": "TLS"},
    ]
    for env in bad:
        with pytest.raises(config.ConfigError, match="kafka"):
            config.load(None, env=env)


def test_every_client_gets_the_role_in_its_client_id_and_the_security() -> None:
    """``client_kwargs``: the client id ``<client_id>-<role>``, the protocol, the SASL credentials in the clear
    only here (aiokafka's arguments)."""
    k = KafkaConfig(client_id="shop-tr", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                    sasl_username="svc", sasl_password="pw")  # fmt: skip
    kwargs = client_kwargs(k, "ingest")
    assert kwargs == {"bootstrap_servers": "127.0.0.1:9092", "client_id": "shop-tr-ingest",
                      "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                      "sasl_plain_username": "svc", "sasl_plain_password": "pw"}  # fmt: skip
    assert client_kwargs(KafkaConfig(), "producer")["client_id"] == "trace-repro-producer"


async def test_the_oauth_token_is_read_again_at_every_call(tmp_path: Path) -> None:
    """OAUTHBEARER: the token file is read at each authentication (a refreshed token is used), or the command run."""
    token = tmp_path / "token"
    token.write_text("first.token.value\n")
    k = KafkaConfig(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", sasl_oauth_token_file=token)
    provider = client_kwargs(k, "ingest")["sasl_oauth_token_provider"]
    assert await provider.token() == "first.token.value"
    token.write_text("second.token.value")
    assert await provider.token() == "second.token.value"
    assert await OAuthToken(command="echo from.a.command").token() == "from.a.command"
    with pytest.raises(RuntimeError, match="exited with status"):
        await OAuthToken(command="false").token()
