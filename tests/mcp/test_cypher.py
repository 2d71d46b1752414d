"""The early check of an agent's Cypher (the server's read-only query is the guarantee: see test_server)."""

from __future__ import annotations

import pytest

from streamer.mcp.cypher import ReadOnlyViolation, UnboundedQuery, check, wrapped


@pytest.mark.parametrize(
    "cypher",
    [
        "CALL db.idx.fulltext.createNodeIndex('Service', 'name')",
        "CALL `db.idx.fulltext.createNodeIndex`('Service', 'name')",
        "CALL `db`.`idx`.`fulltext`.`createNodeIndex`('Service', 'name')",
        "call DB.IDX.FULLTEXT.CREATENODEINDEX('Service', 'name')",
        "CALL /* quiet */ db . idx . fulltext . createNodeIndex('Service', 'name')",
        "CALL\ndb.idx.fulltext.drop('Service')",
        "MATCH (s) WITH s CALL db.idx.fulltext.createNodeIndex('S', 'n') RETURN s",
        "MATCH (s) SET s.x = 1 RETURN s",
        "MATCH (s) /* c */ DETACH /* c */ DELETE s",
        "load  csv FROM 'file:///x.csv' AS r RETURN r",
        "RETURN 1 AS `it's` UNION MERGE (x:X) RETURN 2 AS `it's`",
    ],
)
def test_writes_are_refused_however_they_are_spelled(cypher: str) -> None:
    """Index procedures quoted or not, in any case, with comments or line breaks; write clauses between comments;
    a quote inside a back-quoted name does not hide what follows it."""
    with pytest.raises(ReadOnlyViolation):
        check(cypher)


@pytest.mark.parametrize(
    "cypher",
    [
        "RETURN 'CREATE (n) SET x' AS text",
        "MATCH (s:Service) RETURN s.set, s.offset, $merge // DELETE",
        "RETURN 1 AS `CREATE`",
        "CALL db.idx.fulltext.queryNodes('Service', 'check') YIELD node RETURN node",
        "CALL dbms.procedures() YIELD name RETURN name",
        "RETURN '}' AS brace, `{` AS name",
    ],
)
def test_reads_pass(cypher: str) -> None:
    """Keywords inside strings, comments and names, properties and parameters named like clauses, query
    procedures, and braces inside literals are not writes."""
    assert check(cypher) == cypher


def test_what_cannot_be_bounded_is_refused_and_the_rest_is_wrapped() -> None:
    """A query that would close the wrapper's ``CALL {``, or that has no RETURN, is refused; a trailing ``;`` and a
    trailing comment stay inside the wrapper."""
    for cypher in ("RETURN 1 } RETURN 2", "CALL { RETURN 1 AS x", "CALL db.labels()"):
        with pytest.raises(UnboundedQuery):
            check(cypher)
    body = check("MATCH (s) RETURN s // the last line\n; ;")
    assert wrapped(body, 10) == "CALL {\nMATCH (s) RETURN s // the last line\n}\nRETURN * LIMIT 11"
