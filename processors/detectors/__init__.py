"""Detectors: processors that find something in a stage's events and publish it (one folder each)."""
