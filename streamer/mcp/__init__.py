"""``trace-repro mcp``: a Model Context Protocol server over the live graph, for coding agents.

``settings`` (what it reads and what it may do), ``tools_findings`` (incidents, repros, verdicts, contracts),
``tools_topology`` (service map, critical path, fan-out, blast radius, hot rows, read-only Cypher), ``metrics`` (the
same analytics as Prometheus series), ``server`` (FastMCP, stdio and bearer-token streamable HTTP).
"""
