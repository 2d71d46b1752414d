"""Stage 1: traces assembled in event time, requests, calls, row accesses, critical paths."""
