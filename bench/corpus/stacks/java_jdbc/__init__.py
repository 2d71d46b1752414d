"""The Java service (``corpus/CorpusService.java``: JDBC, the JDK's HTTP server, the OpenTelemetry Java agent), its
own source checkout for the code locator; ``app`` starts it in a JVM and sends it the corpus's requests."""

from bench.corpus.stacks.java_jdbc.app import STACK, plans, start

__all__ = ["STACK", "plans", "start"]
