"""A proof-of-fix scenario: "split a bill", a two-route service whose rounding bug is fixed one route at a time.

``split`` is the code of each build (0.9 correct, 1.0 buggy on both routes, 1.1 fixed on one, 1.2 on both, 1.3
fixed but broken elsewhere, 1.4 = 1.2 with little traffic); ``service`` turns calls into traced requests and the
fix's ``split.rounded`` event into OTel log records, exported to Kafka like the collector would; ``traffic``
runs the builds one after another (a draining 1.0 pod overlapping 1.1). A workload for the regression detector
and the proof judge, not part of the daemon.
"""
