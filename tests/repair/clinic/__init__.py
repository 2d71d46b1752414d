"""A second sample service for the repair and repro tests: on-call doctors (write skew) and a ledger (read skew).

Functions take a psycopg connection (autocommit, like the shop's) and run one explicit transaction each.
"""
