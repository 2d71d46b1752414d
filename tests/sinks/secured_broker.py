"""A private Kafka broker with a SASL_SSL listener, as a platform team runs one, for the security tests.

One KRaft node (the jars of :mod:`streamer.engines.kafka`) in a run directory of its own, with three listeners: the
SASL_SSL one the daemon is pointed at (SCRAM-SHA-512, or OAUTHBEARER with unsecured tokens; TLS with a certificate
of a CA made here, client certificates required), a PLAINTEXT one the tests use to produce their input and read the
outputs, and the controller's. The CA, the broker's certificate (for 127.0.0.1) and the client's (its key encrypted
with :data:`KEY_PASSWORD`) are made with ``cryptography``; the SCRAM user is written when the storage is formatted
(``--add-scram``).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from streamer.engines import Layout, jars
from streamer.engines import kafka as engine
from streamer.engines.process import EngineError, free_port, spawn, stop, wait_until
from streamer.engines.state import EngineState

USER = "trace-repro"
PASSWORD = "scram-Secret-7f3a"
KEY_PASSWORD = "key-Secret-91c2"


@dataclass(frozen=True)
class SecuredBroker:
    plaintext: str  # bootstrap of the PLAINTEXT listener (the tests' own clients)
    secured: str  # bootstrap of the SASL_SSL listener (the daemon's)
    ca: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD


def unsecured_token(subject: str, expires_in_s: float) -> str:
    """An unsecured JWT (``alg: none``) as the broker's default OAUTHBEARER validator takes them."""

    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    now = time.time()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': int(now), 'exp': int(now + expires_in_s)})}."


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
                 *, ca: bool = False, ip: str | None = None) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)  # fmt: skip
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def make_certificates(where: Path) -> tuple[Path, Path, Path, Path]:
    """(CA, broker keystore PEM: key + certificate, client certificate, client key encrypted) under ``where``."""
    ca_key, broker_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("trace-repro test CA", ca_key, "trace-repro test CA", ca_key, ca=True)
    broker = _certificate("127.0.0.1", broker_key, "trace-repro test CA", ca_key, ip="127.0.0.1")
    client = _certificate(USER, client_key, "trace-repro test CA", ca_key)
    paths = where / "ca.pem", where / "broker.pem", where / "client.pem", where / "client-key.pem"
    paths[0].write_bytes(_pem(ca))
    paths[1].write_bytes(_key(broker_key) + _pem(broker))
    paths[2].write_bytes(_pem(client))
    paths[3].write_bytes(_key(client_key, KEY_PASSWORD))
    return paths


def properties(plain: int, secured: int, controller: int, data: Path, ca: Path, keystore: Path) -> str:
    """The shipped broker's properties, plus the SASL_SSL listener with its TLS and SCRAM settings."""
    base = engine.broker_properties(plain, controller, data).splitlines()
    props = dict(line.split("=", 1) for line in base)
    props |= {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secured},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secured}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,OAUTHBEARER",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        # OAUTHBEARER with the broker's own validator of unsecured tokens (alg none): checks their claims and expiry
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca),
        "listener.name.sasl_ssl.ssl.client.auth": "required",  # (the unprefixed one is ignored on SASL_SSL)
    }  # fmt: skip
    return "".join(f"{k}={v}\n" for k, v in props.items())


@contextmanager
def secured_broker() -> Iterator[SecuredBroker]:
    """A broker as the module docstring says, stopped and removed on exit."""
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-sasl-"))
    layout = Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir)
    pid = None
    try:
        classpath = jars.resolve(layout, "kafka-pom.xml")
        ca, keystore, client_cert, client_key = make_certificates(run_dir)
        plain, secured, controller = free_port(), free_port(), free_port()
        props, log4j, log = run_dir / "server.properties", run_dir / "log4j2.properties", run_dir / "kafka.log"
        props.write_text(properties(plain, secured, controller, run_dir / "data", ca, keystore))
        log4j.write_text(engine.LOG4J2.format(level="WARN"))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        fmt = engine.java_command(classpath, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                                  "-c", str(props), "--add-scram",
                                  f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]",
                                  log4j=log4j, opts=["-Xmx256m", "-XX:+UseSerialGC"])  # fmt: skip
        result = subprocess.run(fmt, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise EngineError(f"formatting Kafka storage failed:\n{result.stdout}\n{result.stderr}")
        pid = spawn(engine.java_command(classpath, "kafka.Kafka", str(props), log4j=log4j), log=log)
        state = EngineState("kafka", pid, plain, str(run_dir / "data"), str(log), {})
        wait_until(lambda: engine.healthy(state), what="the secured Kafka", timeout_s=120, pid=pid, log=log)
        yield SecuredBroker(f"127.0.0.1:{plain}", f"127.0.0.1:{secured}", ca, client_cert, client_key)
    finally:
        if pid is not None:
            stop(pid)
        shutil.rmtree(run_dir, ignore_errors=True)
