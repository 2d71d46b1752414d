"""The FastAPI + asyncpg service (``app``), its own source checkout for the code locator."""

from bench.corpus.stacks.fastapi_asyncpg.app import STACK, plans, start

__all__ = ["STACK", "plans", "start"]
