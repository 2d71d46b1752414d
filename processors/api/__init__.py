"""The component API: factories, processors, sinks' base, telemetry, lazy exports, state events."""
