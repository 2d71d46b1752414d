"""``[falkordb]``: where the graph lives, how to reach it (user, password, TLS) and how it is written."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from processors.api.component import Section
from sinks.graph.endpoint import Endpoint, redact


class FalkorDBConfig(Section):
    """The FalkorDB server and the graph of this environment."""

    url: str = Field(
        "redis://127.0.0.1:6379",
        description="FalkorDB URL: redis://[user[:password]@]host:port, or rediss:// for TLS (logged without the "
        "password; prefer `password` for the secret)",
    )
    password: SecretStr | None = Field(
        None, description="the server's or the ACL user's password (wins over one in the url); from the environment: "
        "TRACE_REPRO_FALKORDB__PASSWORD",
    )  # fmt: skip
    tls_ca_file: str = Field("", description="rediss://: CA certificate(s) the server's certificate is checked against "
                             "(PEM; default: the system's CAs)")  # fmt: skip
    tls_cert_file: str = Field(
        "", description="rediss://: client certificate (PEM), for a server with tls-auth-clients"
    )
    tls_key_file: str = Field("", description="rediss://: the client certificate's private key (PEM)")
    tls_check_hostname: bool = Field(True, description="rediss://: the certificate must name the url's host")
    graph: str = Field("", description='graph name; default "trace_repro_<environment>" (one graph per environment)')
    batch_rows: int = Field(2000, ge=1, description="rows per UNWIND statement")
    query_timeout_ms: int = Field(30_000, ge=100, description="per-query timeout (the server needs TIMEOUT_MAX)")
    publish_lease_s: float = Field(
        30.0, gt=0, description="an event claimed for publishing and not recorded, its claim not renewed for this "
        "long (its instance stopped in between), is published by the next instance that derives it, which waits "
        "until then"
    )  # fmt: skip

    @field_validator("url")
    @classmethod
    def _reachable(cls, url: str) -> str:
        Endpoint.parse(url)  # a bad URL fails at start, named without its password
        return url

    def endpoint(self) -> Endpoint:
        """The server, credentials and TLS settings of this section."""
        return Endpoint.parse(self.url, password=self.password, ca_file=self.tls_ca_file,
                              cert_file=self.tls_cert_file, key_file=self.tls_key_file,
                              check_hostname=self.tls_check_hostname)  # fmt: skip

    @property
    def redacted_url(self) -> str:
        """The URL as a log line may show it (password replaced by ``***``)."""
        return redact(self.url)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact(value) if name == "url" and isinstance(value, str) else value)
