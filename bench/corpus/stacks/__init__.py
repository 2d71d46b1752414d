"""The corpus on the stacks people run: the same races as ``bench.corpus.apps``, written the way each stack's users
write them, traced by the stack's stock OpenTelemetry instrumentations with their DEFAULT options (no statement
parameters, no ``code.*``), exporting OTLP to a real Collector.

Each stack reuses a corpus scenario's plan, seed rows and database inspection (``bench.corpus.apps``: same tables,
same rows, same damage checked in PostgreSQL) and swaps its handlers for HTTP views of its own
(``bench.corpus.stacks.web``), declared the way the framework's users declare them (decorators, ``urlpatterns``);
its rounds are numbered from the stack's own offset so that stacks share one schema without sharing a row. Each
stack is a package of its own (``<stack>/app.py``): its source checkout, for the code locator.
"""
