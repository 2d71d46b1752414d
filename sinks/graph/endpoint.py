"""Where FalkorDB is and how to reach it: host, port, ACL user, password and TLS, from ``falkordb.url`` and the
section's secret and TLS keys; and the URL as a log line may show it.

``redis://[user[:password]@]host[:port]`` is plain TCP, ``rediss://`` is TLS (the server's certificate checked
against ``tls_ca_file``, or the system's CAs; a client certificate for servers that ask for one). A password given
apart (``falkordb.password``, a ``SecretStr`` from ``TRACE_REPRO_FALKORDB__PASSWORD``) wins over one in the URL.
The password never leaves :class:`Endpoint` but as the client's keyword argument: its ``repr`` and :func:`redact`
replace it with ``***``, so every log line and error can name the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import SecretStr

SCHEMES = ("redis", "rediss")
DEFAULT_PORT = 6379
CONNECT_TIMEOUT_S = 5.0  # a server that does not answer the TCP handshake (a partition) is retried, not waited on


def redact(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (what a log line may show)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One FalkorDB server and the credentials and TLS settings to reach it."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True

    @classmethod
    def parse(cls, url: str, *, password: SecretStr | None = None, ca_file: str = "", cert_file: str = "",
              key_file: str = "", check_hostname: bool = True) -> Endpoint:  # fmt: skip
        """The endpoint of ``url`` (``redis://`` or ``rediss://``); ``ValueError`` (naming the URL without its
        password) if it is not one."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"not a FalkorDB URL: {redact(url)} ({exc})") from None
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ValueError(f"not a FalkorDB URL: {redact(url)} (expected redis://host:port or rediss://host:port)")
        secret = password
        if secret is None and parts.password is not None:
            secret = SecretStr(unquote(parts.password))
        return cls(host=parts.hostname, port=port or DEFAULT_PORT,
                   username=unquote(parts.username) if parts.username else None, password=secret,
                   tls=parts.scheme == "rediss", ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                   check_hostname=check_hostname)  # fmt: skip

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the falkordb client (those of ``redis.asyncio.Redis``) for this endpoint."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "socket_connect_timeout": CONNECT_TIMEOUT_S}
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        if self.tls:
            kwargs |= {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": self.check_hostname,
                       "ssl_ca_certs": self.ca_file or None, "ssl_certfile": self.cert_file or None,
                       "ssl_keyfile": self.key_file or None}  # fmt: skip
        return kwargs

    def __str__(self) -> str:
        user = f"{self.username}" if self.username else ""
        auth = f"{user}:***@" if self.password is not None else (f"{user}@" if user else "")
        return f"{'rediss' if self.tls else 'redis'}://{auth}{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"Endpoint({self!s})"
