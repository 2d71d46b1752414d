"""Shared machinery of the detectors that publish findings: per-trace tallies in event-time windows."""
