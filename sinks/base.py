"""The one ``Sink`` base and its two errors (defined with the processors, whose connectors are sinks too)."""

from processors.api.sink import PermanentSinkError, RetryableSinkError, Sink

__all__ = ["PermanentSinkError", "RetryableSinkError", "Sink"]
