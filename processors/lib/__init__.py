"""Shared libraries of the stages and detectors: sketches, statistical tests, invariants, parts."""
