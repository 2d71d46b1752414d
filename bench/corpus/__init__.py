"""The anomaly corpus: small apps that produce real concurrency anomalies on PostgreSQL at READ COMMITTED, each with
its controls, recorded as the Kafka messages trace-repro consumes (OTLP spans, Debezium row changes).

Every request is one trace: a SERVER span ``POST <route>``, an INTERNAL handler span (``code.function.name`` =
``corpus.<scenario>.<function>``) and the psycopg CLIENT spans of its one transaction (``capture_parameters``), from
a service ``corpus-<scenario>`` v1.0.0; row changes come from the real Debezium connector. Two requests race per
round, interleaved deterministically (``race``): the buggy pair, or the same race on a protected code path (a
control, which must yield no incident). Tables are keyed by natural keys, not ``id``; REPLICA IDENTITY FULL.

Scenarios (``apps``; each module's docstring explains the anomaly in Adya's terms):

- ``lost_update``: read-compute-write of one balance (G-single on one row, P4); controls FOR UPDATE, atomic update
- ``write_skew``: the on-call doctors (G2-item); controls FOR UPDATE on the predicate, SERIALIZABLE with retry
- ``phantom``: check-then-insert of a booking (G2 on a predicate); control: unique constraint + ON CONFLICT
- ``read_skew``: an audit reading two accounts around a transfer (G-single); control: one statement
- ``invariant_violation``: oversell with relative decrements (stock < 0, never a lost update); control: guarded
- ``relative_updates``: two relative decrements (a control only: no anomaly)

``python -m bench.corpus record`` records them all into ``tests/corpus/fixtures`` (``<scenario>.jsonl`` and
``<scenario>.manifest.json``); ``tests/corpus`` replays them through both daemon stages, runs them live, and proves
each bug scenario's first incident with the repro worker (RED, repair, GREEN) on the scenario's own schema
(``Scenario.schema_sql``); ``python -m tests.corpus.table`` prints docs/detection.md's table of all of it.
"""
