"""The whole daemon on a broker it can only reach over SASL_SSL (SCRAM-SHA-512, TLS with a private CA, a client
certificate whose key is encrypted): spans and row changes in, an incident out, no secret in any log line."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from pydantic import SecretStr

from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig
from tests.faults.faultkit import MS, SETTINGS, Traffic, cdc_topic, incident_events, produce, wait_all
from tests.harness import Harness, harness_settings
from tests.sinks.secured_broker import KEY_PASSWORD, PASSWORD, USER, SecuredBroker, secured_broker, unsecured_token

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def broker() -> Iterator[SecuredBroker]:
    with secured_broker() as b:
        yield b


def _security(broker: SecuredBroker) -> dict[str, str]:
    """The ``[kafka]`` security settings of a daemon on ``broker``, secrets as environment variables."""
    return {"kafka__security_protocol": "SASL_SSL", "kafka__sasl_mechanism": "SCRAM-SHA-512",
            "kafka__sasl_username": USER, "kafka__sasl_password": PASSWORD, "kafka__ssl_cafile": str(broker.ca),
            "kafka__ssl_certfile": str(broker.client_cert), "kafka__ssl_keyfile": str(broker.client_key),
            "kafka__ssl_key_password": KEY_PASSWORD}  # fmt: skip


async def test_the_daemon_reads_spans_and_files_an_incident_over_sasl_ssl(
    broker: SecuredBroker, falkordb_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Both stages, the Kafka sink and the admin client on the SASL_SSL listener only: a planted lost update in the
    spans and row changes (produced on the PLAINTEXT listener, as a collector and Debezium would) becomes one
    incident on the incidents topic; neither password appears in anything logged."""
    caplog.set_level(logging.DEBUG)
    settings = harness_settings(broker.secured, falkordb_url, **SETTINGS, **_security(broker))
    harness = Harness(settings, broker.plaintext, falkordb_url)
    k = settings.kafka
    assert k.bootstrap == broker.secured and k.security_protocol == "SASL_SSL"
    traffic = Traffic(k.spans_topic, cdc_topic(harness))
    await harness.create_topics(k.spans_topic, cdc_topic(harness))
    await harness.start()
    try:
        await produce(broker.plaintext, traffic.stream(40, 1, start_ns=time.time_ns() - 200 * MS))
        await wait_all(harness, traffic.expected, "every trace and the incident, over SASL_SSL", 60)
        events = incident_events(await harness.consume_all(k.incidents_topic, expect=1, timeout_s=20))
    finally:
        await harness.stop()
    assert [e["entity"] for e in events] == traffic.expected.planted
    logged = caplog.text + "".join(capfd.readouterr())
    assert logged and PASSWORD not in logged and KEY_PASSWORD not in logged


@pytest.mark.parametrize("wrong", ["password", "certificate"])
async def test_a_wrong_password_or_no_client_certificate_is_refused(broker: SecuredBroker, wrong: str) -> None:
    """The listener really checks: the same client with another password, or without its certificate, gets in
    nowhere (so the test above went through SCRAM and mutual TLS)."""
    good = KafkaConfig(bootstrap=broker.secured, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                       sasl_username=USER, sasl_password=PASSWORD, ssl_cafile=broker.ca,
                       ssl_certfile=broker.client_cert, ssl_keyfile=broker.client_key,
                       ssl_key_password=KEY_PASSWORD)  # type: ignore[arg-type]  # fmt: skip
    admin = AIOKafkaAdminClient(**client_kwargs(good, "admin"), request_timeout_ms=5000)
    await admin.start()
    try:
        assert isinstance(await admin.list_topics(), list)
    finally:
        await admin.close()
    update = ({"sasl_password": SecretStr("not-the-password")} if wrong == "password"
              else {"ssl_certfile": None, "ssl_keyfile": None, "ssl_key_password": None})  # fmt: skip
    bad = good.model_copy(update=update)
    admin = AIOKafkaAdminClient(**client_kwargs(bad, "admin"), request_timeout_ms=5000)
    with pytest.raises((KafkaError, OSError)):
        try:
            await admin.start()
            await admin.list_topics()
        finally:
            await admin.close()


async def _list_topics(config: KafkaConfig) -> list[str]:
    admin = AIOKafkaAdminClient(**client_kwargs(config, "admin"), request_timeout_ms=5000)
    try:
        await admin.start()
        topics: list[str] = await admin.list_topics()
        return topics
    finally:
        await admin.close()


async def test_oauthbearer_takes_the_token_from_the_file_at_every_authentication(broker: SecuredBroker,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    """OAUTHBEARER on the same listener: the token file's current token is what the broker sees (an expired one is
    refused; once the file holds a fresh one, the next client gets in with no change of configuration)."""
    token = tmp_path / "kafka-token"
    token.write_text(unsecured_token(USER, expires_in_s=-60))
    k = KafkaConfig(bootstrap=broker.secured, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                    sasl_oauth_token_file=token, ssl_cafile=broker.ca, ssl_certfile=broker.client_cert,
                    ssl_keyfile=broker.client_key, ssl_key_password=KEY_PASSWORD)  # fmt: skip
    with pytest.raises((KafkaError, OSError)):
        await _list_topics(k)
    token.write_text(unsecured_token(USER, expires_in_s=3600))
    assert isinstance(await _list_topics(k), list)
