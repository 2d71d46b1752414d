"""The graph's rows, from both stages' output."""
