"""SQL analysis: DB spans into row accesses (``access``), the SQL text helpers (``syntax``), ``[sql]`` (``config``);
a predicate access's whole WHERE compiled and evaluated on row images (``predicate``) with PostgreSQL's semantics
(``pgsemantics``), and written back for people (``predicate_text``)."""

from processors.sql.access import SqlAccessExtractor
from processors.sql.config import SqlConfig
from processors.sql.syntax import conjuncts, identity_entity_key, normalise_key_value, number_qmarks, psycopg_to_qmark

__all__ = [
    "SqlAccessExtractor",
    "SqlConfig",
    "conjuncts",
    "identity_entity_key",
    "normalise_key_value",
    "number_qmarks",
    "psycopg_to_qmark",
]
