"""The settings every Kafka client of the daemon shares: where the brokers are, who it is, how it authenticates.

Every consumer, producer and admin client is built with :func:`client_kwargs` (``AIOKafkaConsumer(**client_kwargs(
config, "ingest"), ...)``), so a secured cluster is configured once, in ``[kafka]``, for all of them:

- ``security_protocol`` PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL;
- TLS (SSL, SASL_SSL): the brokers' certificates checked against ``ssl_cafile`` (or the system's CAs), their host
  name checked unless ``ssl_check_hostname = false``; a client certificate (``ssl_certfile`` + ``ssl_keyfile``, with
  ``ssl_key_password`` when the key is encrypted) for brokers that require one. The files are read each time a client
  is built, so a renewed certificate is used by the next client (the producer renews its client after a failure);
- SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (``sasl_username`` + ``sasl_password``) or OAUTHBEARER: the token comes
  from ``sasl_oauth_token_file`` (read again at every authentication, so whatever refreshes the file is picked up)
  or from ``sasl_oauth_token_command`` (run, without a shell, at every authentication; its standard output is the
  token). Tokens are unsecured JWTs or the identity provider's: the broker decides; the daemon only hands them over.

Secrets are :class:`~pydantic.SecretStr` until here; the kwargs hold them in the clear and are never logged.
"""

from __future__ import annotations

import asyncio
import shlex
import ssl
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

from sinks.kafka.config import KafkaConfig

TOKEN_COMMAND_TIMEOUT_S = 30.0


class TokenError(RuntimeError):
    """No OAUTHBEARER token: the file is missing or empty, or the command failed."""


class OAuthToken(AbstractTokenProvider):  # type: ignore[misc]  # (aiokafka is untyped)
    """An OAUTHBEARER token read from a file, or printed by a command, at every call (nothing cached here)."""

    def __init__(self, file: Path | None = None, command: str = "") -> None:
        self.file = file
        self.command = command

    async def token(self) -> str:
        if self.file is not None:
            text = await asyncio.to_thread(_read, self.file)
        else:
            text = await _run(self.command)
        token = text.strip()
        if not token:
            raise TokenError(f"OAUTHBEARER: empty token from {self.file or self.command.split(' ', 1)[0]}")
        return token


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise TokenError(f"OAUTHBEARER: cannot read {path}: {exc.strerror}") from exc


async def _run(command: str) -> str:
    argv = shlex.split(command)
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TOKEN_COMMAND_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        raise TokenError(f"OAUTHBEARER: {argv[0]} did not answer within {TOKEN_COMMAND_TIMEOUT_S:g} s") from None
    if proc.returncode:
        raise TokenError(f"OAUTHBEARER: {argv[0]} exited with status {proc.returncode}")
    return out.decode()


def ssl_context(config: KafkaConfig) -> ssl.SSLContext:
    """The TLS context of ``config``: its CA, its client certificate, its host name check."""
    password = config.ssl_key_password.get_secret_value() if config.ssl_key_password is not None else None
    context: ssl.SSLContext = create_ssl_context(
        cafile=str(config.ssl_cafile) if config.ssl_cafile else None,
        certfile=str(config.ssl_certfile) if config.ssl_certfile else None,
        keyfile=str(config.ssl_keyfile) if config.ssl_keyfile else None,
        password=password,
    )
    context.check_hostname = config.ssl_check_hostname
    return context


def client_kwargs(config: KafkaConfig, role: str) -> dict[str, Any]:
    """The keyword arguments every aiokafka client of the daemon takes: bootstrap, ``client_id`` (the prefix and
    ``role``), security. The caller adds what is its own (group, offsets, acks...)."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap,
        "client_id": f"{config.client_id}-{role}",
        "security_protocol": config.security_protocol,
    }
    if config.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = ssl_context(config)
    if config.security_protocol.startswith("SASL_"):
        kwargs["sasl_mechanism"] = config.sasl_mechanism
        if config.sasl_mechanism == "OAUTHBEARER":
            kwargs["sasl_oauth_token_provider"] = OAuthToken(config.sasl_oauth_token_file,
                                                             config.sasl_oauth_token_command)  # fmt: skip
        else:
            assert config.sasl_password is not None  # (the config's validator)
            kwargs["sasl_plain_username"] = config.sasl_username
            kwargs["sasl_plain_password"] = config.sasl_password.get_secret_value()
    return kwargs


__all__ = ["OAuthToken", "TokenError", "client_kwargs", "ssl_context"]
