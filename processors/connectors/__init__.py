"""Connectors: components that consume one pipeline and produce into another (the proof desk, the repro worker)."""
