"""Schemas of Avro messages from a schema registry: fetched before a batch is decoded, kept parsed in a bounded cache.

The framing (``wire``): Confluent's (magic byte 0, then the schema id as 4 big-endian bytes, resolved by
``GET {url}/schemas/ids/{id}``, which Confluent SR, Karapace, Redpanda and Apicurio's Confluent-compatible API all
answer) or Apicurio's own (magic byte 0, then the global id as 8 bytes, ``GET {url}/ids/globalIds/{id}``). Decoding is
synchronous and never waits on the network: the runtime calls :meth:`SchemaRegistry.prepare` with a batch first, which
fetches every id the batch names and the cache lacks (in a worker thread, never blocking the event loop), and holds
the batch's schemas until the next batch, so a batch naming more schemas than ``max_schemas`` still decodes.

Failures, by kind: the registry unreachable, timing out, or answering 5xx/429/401/403 raises
:class:`~streamer.decode.errors.DecodeUnavailable` (the runtime pauses consumption and asks again after a backoff;
nothing of the batch is processed or committed meanwhile); an id it does not know (404) or a schema that does not
parse is remembered as such and every message naming it is dead-lettered with that reason (``avro_unknown_schema``,
``avro_invalid_schema``). Credentials are sent, never logged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable

from processors.api.telemetry import Telemetry
from processors.state.lru import CountedLRU
from streamer.decode.avro import Schema, parse_schema
from streamer.decode.config import SchemaRegistryConfig
from streamer.decode.errors import DecodeError, DecodeUnavailable

__all__ = ["MAX_SCHEMA_BYTES", "SchemaRegistry", "framed_id"]

MAX_SCHEMA_BYTES = 1 << 20  # a registry's answer longer than this is refused as a schema
MAGIC = 0


def framed_id(data: bytes | None, wire: str) -> int | None:
    """The schema id a registry-framed message names; None when it is not framed (empty, or JSON: never byte 0)."""
    if not data or data[0] != MAGIC:
        return None
    width = 4 if wire == "confluent" else 8
    if len(data) < 1 + width:
        raise DecodeError("avro_invalid", f"a registry-framed message of {len(data)} bytes")
    return int.from_bytes(data[1 : 1 + width], "big")


class SchemaRegistry:
    """The schemas one decoder's messages name: fetched by :meth:`prepare`, read by :meth:`schema`."""

    def __init__(self, config: SchemaRegistryConfig, telemetry: Telemetry) -> None:
        self.config = config
        self.width = 4 if config.wire == "confluent" else 8
        self.telemetry = telemetry
        self._cache: CountedLRU[int, Schema | DecodeError] = CountedLRU(config.max_schemas, telemetry, "schema_cache")
        self._batch: dict[int, Schema | DecodeError] = {}
        self._ssl = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
        telemetry.declare("schemas_fetched", "registry_errors")

    def datum(self, data: bytes) -> tuple[Schema, bytes]:
        """The schema and the Avro datum of a framed message (:func:`framed_id` said it is one)."""
        schema_id = framed_id(data, self.config.wire)
        assert schema_id is not None
        found = self._batch.get(schema_id) or self._cache.get(schema_id)
        if found is None:  # (prepare saw every framed message of the batch: a bug, not the input's fault)
            raise DecodeError("avro_schema_not_fetched", f"schema {schema_id} was not fetched before decoding")
        if isinstance(found, DecodeError):
            raise found
        return found, data[1 + self.width :]

    async def prepare(self, messages: Iterable[bytes | None]) -> None:
        """Fetch every schema ``messages`` name that is not cached; raise ``DecodeUnavailable`` while the registry
        cannot answer."""
        ids: set[int] = set()
        for data in messages:
            try:
                schema_id = framed_id(data, self.config.wire)
            except DecodeError:
                continue  # too short: dead-lettered when decoded
            if schema_id is not None:
                ids.add(schema_id)
        batch: dict[int, Schema | DecodeError] = {}
        for schema_id in sorted(ids):
            found = self._cache.get(schema_id)
            if found is None:
                found = await asyncio.to_thread(self._fetch, schema_id)
                self._cache.put(schema_id, found)
                self.telemetry.count("schemas_fetched")
            batch[schema_id] = found
        self._batch = batch

    def url(self, schema_id: int) -> str:
        base = self.config.url.rstrip("/")
        if self.config.wire == "confluent":
            return f"{base}/schemas/ids/{schema_id}"
        return f"{base}/ids/globalIds/{schema_id}"

    def _headers(self) -> dict[str, str]:
        c = self.config
        if c.bearer_token is not None:
            return {"Authorization": f"Bearer {c.bearer_token.get_secret_value()}"}
        if c.username:
            secret = c.password.get_secret_value() if c.password is not None else ""
            return {"Authorization": "Basic " + base64.b64encode(f"{c.username}:{secret}".encode()).decode()}
        return {}

    def _fetch(self, schema_id: int) -> Schema | DecodeError:
        """The parsed schema of ``schema_id``, or the dead-letter reason of every message naming it."""
        headers = {"Accept": "application/json", **self._headers()}
        request = urllib.request.Request(self.url(schema_id), headers=headers)  # noqa: S310 - http(s) only (config)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s, context=self._ssl) as resp:  # noqa: S310
                body = resp.read(MAX_SCHEMA_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return DecodeError("avro_unknown_schema", f"the registry does not know schema {schema_id}")
            self.telemetry.count("registry_errors")
            raise DecodeUnavailable(f"the schema registry answered {exc.code} for schema {schema_id}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            self.telemetry.count("registry_errors")
            reason = getattr(exc, "reason", exc)
            raise DecodeUnavailable(f"the schema registry is unreachable: {reason}"[:300]) from None
        if len(body) > MAX_SCHEMA_BYTES:
            return DecodeError("avro_invalid_schema", f"schema {schema_id} is over {MAX_SCHEMA_BYTES} bytes")
        try:
            text = body.decode("utf-8")
            if self.config.wire == "confluent":
                doc = json.loads(text)
                doc = doc if isinstance(doc, dict) else {}
                text = doc.get("schema")
                if doc.get("schemaType", "AVRO") != "AVRO" or not isinstance(text, str):
                    return DecodeError("avro_invalid_schema", f"schema {schema_id} is not an Avro schema")
            return parse_schema(text)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if isinstance(exc, DecodeError):
                return exc
            return DecodeError("avro_invalid_schema", f"schema {schema_id}: {exc}"[:300])
