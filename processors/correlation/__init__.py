"""Stage 2: row changes credited to the traces that made them, and accesses keyed by them."""
