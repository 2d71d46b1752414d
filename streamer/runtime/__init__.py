"""The aiokafka runtime: consumer groups, batches, event-time watermarks, commits."""
