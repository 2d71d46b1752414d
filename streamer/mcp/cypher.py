"""An agent's own Cypher (``query_graph``): read-only, and bounded in rows, time and bytes before it reaches us.

Nothing here trusts the query's text to bound itself:

- **rows**: the query runs as ``CALL { <query> } RETURN * LIMIT <limit + 1>``, so the server stops producing rows
  after ``limit + 1`` (one more than asked says that rows were cut). ``RETURN *`` gives the columns in name order.
- **time**: ``GRAPH.RO_QUERY ... timeout <ms>``, the server's own per-query timeout. The server checks it between
  records, so one expression that builds a huge value (``range(1, 10^9)``) ends only when it is built or when the
  server's ``QUERY_MEM_CAPACITY`` refuses it.
- **bytes**: the reply is read by a parser that stops at ``max_result_bytes`` and drops the connection, so a
  single huge value (a list of millions of numbers, a long string) never reaches this process's memory.
- **writes**: every statement is a ``GRAPH.RO_QUERY``, which the server refuses to run when it would write
  (``CREATE``, ``MERGE``, ``SET``, ``DELETE``, ``REMOVE``, ``FOREACH``, index procedures, however they are spelled
  or quoted). That refusal is the guarantee. :func:`check` before it only gives an earlier, clearer message, and
  keeps the query inside the wrapper (its braces must balance, so it cannot close the ``CALL {``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final

from falkordb.asyncio import FalkorDB
from redis._parsers.resp2 import _AsyncRESP2Parser
from redis.exceptions import RedisError, ResponseError

from sinks.graph.endpoint import Endpoint

# Clauses that write, and LOAD CSV (a read of the server's files, not of the graph). A keyword right after ``.``,
# ``$`` or a word character is a property, parameter or part of a name, not a clause.
_CLAUSES: Final = re.compile(
    r"(?<![\w.$])(CREATE|MERGE|SET|DELETE|DETACH|REMOVE|DROP|FOREACH|LOAD\s+CSV)\b", re.IGNORECASE
)
# A procedure's name after CALL: dotted parts, each a word or a back-quoted name (which may itself hold dots).
_PART: Final = r"(?:`[^`]*`|[A-Za-z_]\w*)"
_CALL: Final = re.compile(rf"(?<![\w.$])CALL\s+({_PART}(?:\s*\.\s*{_PART})*)", re.IGNORECASE)
# What is data, commentary or a name rather than syntax, in one pass (a quote inside a back-quoted name, or a
# back-quote inside a string, is no delimiter): strings, comments, back-quoted names.
_TOKENS: Final = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|//[^\n]*|/\*.*?\*/|`[^`]*`", re.DOTALL)
READ_ONLY_REFUSAL: Final = "is to be executed only on read-only queries"  # the server's words for a write


class ReadOnlyViolation(ValueError):
    """Cypher that would change the graph, seen before it is sent (the server would refuse it too)."""


class UnboundedQuery(ValueError):
    """Cypher that cannot run inside the bounding wrapper (unbalanced braces, a standalone procedure call)."""


class QueryTimedOut(RuntimeError):
    """The server ended the query at its timeout."""


class ReplyTooLarge(RedisError):
    """The server's reply passed the byte bound: the read stopped there and the connection was dropped."""


def _write_procedure(name: str) -> bool:
    """Index procedures that create or drop (``db.idx.fulltext.createNodeIndex``, ``db.idx.fulltext.drop``, ...)."""
    parts = name.lower().split(".")
    return parts[:2] == ["db", "idx"] and not parts[-1].startswith("query")


def check(cypher: str) -> str:
    """The query as it will be wrapped (trailing ``;`` removed); :class:`ReadOnlyViolation` for a write clause or
    an index procedure, :class:`UnboundedQuery` when it cannot run inside the wrapper."""
    bare = _TOKENS.sub(lambda m: m[0] if m[0].startswith("`") else " ", cypher)  # names kept, for procedures
    syntax = _TOKENS.sub(lambda m: " _ " if m[0].startswith("`") else " ", cypher)  # clauses and braces only
    for found in _CALL.finditer(bare):
        name = ".".join(part.strip("`") for part in re.findall(_PART, found.group(1)))
        if _write_procedure(name):
            raise ReadOnlyViolation(f"procedure {name!r} writes: refused, this server is read-only")
    clause = _CLAUSES.search(syntax)
    if clause:
        word = " ".join(clause.group(1).upper().split())
        raise ReadOnlyViolation(f"write clause {word!r} refused: this server is read-only")
    depth = 0
    for ch in syntax:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            raise UnboundedQuery("unbalanced braces: a '}' closes nothing the query opened")
    if depth:
        raise UnboundedQuery("unbalanced braces: a '{' is never closed")
    if not re.search(r"\bRETURN\b", syntax, re.IGNORECASE):
        raise UnboundedQuery("the query must end with RETURN (a procedure: CALL proc(...) YIELD col RETURN col)")
    body = cypher.rstrip()
    while body.endswith(";"):
        body = body[:-1].rstrip()
    return body


def wrapped(body: str, limit: int) -> str:
    """``body`` inside ``CALL { }`` with the row limit (newlines: a trailing ``//`` comment ends at its own)."""
    return f"CALL {{\n{body}\n}}\nRETURN * LIMIT {int(limit) + 1}"


def capped_parser(max_bytes: int) -> type[_AsyncRESP2Parser]:
    """redis-py's RESP2 parser, raising :class:`ReplyTooLarge` once a reply passes ``max_bytes`` (counted before a
    bulk string is read, so a huge one is refused unread). redis-py drops a connection whose read raised."""

    class CappedReplyParser(_AsyncRESP2Parser):
        _taken = 0

        async def read_response(self, disable_decoding: bool = False) -> Any:
            self._taken = 0
            return await super().read_response(disable_decoding)

        async def _read(self, length: int) -> bytes:
            self._take(length + 2)
            return await super()._read(length)

        async def _readline(self) -> bytes:
            line = await super()._readline()
            self._take(len(line) + 2)
            return line

        def _take(self, n: int) -> None:
            self._taken += n
            if self._taken > max_bytes:
                raise ReplyTooLarge(f"the result is larger than {max_bytes} bytes")

    return CappedReplyParser


class AgentCypher:
    """Runs agents' Cypher on one graph with the bounds of the module docstring; a connection opened on first use."""

    def __init__(self, url: str | Endpoint, graph: str, *, max_result_bytes: int, socket_timeout_s: float) -> None:
        self.endpoint = url if isinstance(url, Endpoint) else Endpoint.parse(url)  # user, password and TLS honoured
        self.graph_name = graph
        self.max_result_bytes = max_result_bytes
        self.socket_timeout_s = socket_timeout_s
        self._graph: Any = None

    async def _connect(self) -> Any:
        if self._graph is None:
            parser = capped_parser(self.max_result_bytes)
            options = {
                "socket_timeout": self.socket_timeout_s,
                "socket_connect_timeout": 5,
                "protocol": 2,
            }  # RESP2: the parser above (and no maintenance notifications, which need RESP3)
            # (the constructor asks the server whether it is a cluster, a blocking call)
            db = await asyncio.to_thread(lambda: FalkorDB(**{**self.endpoint.client_kwargs(), **options}))
            db.connection.connection_pool.connection_kwargs["parser_class"] = parser  # every connection it opens
            self._graph = db.select_graph(self.graph_name)
        return self._graph

    async def run(self, cypher: str, params: dict[str, Any], *, limit: int, timeout_ms: int
                  ) -> tuple[list[str], list[list[Any]], bool]:  # fmt: skip
        """(columns, at most ``limit`` rows, whether more rows existed). Raises :class:`ReadOnlyViolation` (also
        when the server refused a write), :class:`UnboundedQuery`, :class:`QueryTimedOut`, :class:`ReplyTooLarge`, or
        the server's error."""
        body = check(cypher)
        graph = await self._connect()
        try:
            result = await graph.ro_query(wrapped(body, limit), params, timeout=int(timeout_ms))
        except ResponseError as exc:
            if READ_ONLY_REFUSAL in str(exc):
                raise ReadOnlyViolation(f"refused by the graph server, this server is read-only ({exc})") from exc
            if "timed out" in str(exc).lower():
                raise QueryTimedOut(f"timed out: the graph server ended the query after {timeout_ms} ms") from exc
            raise
        header = [h[1] if isinstance(h, list | tuple) else h for h in (result.header or [])]
        columns = [c.decode() if isinstance(c, bytes) else str(c) for c in header]
        rows = [list(r) for r in result.result_set]
        return columns, rows[:limit], len(rows) > limit
