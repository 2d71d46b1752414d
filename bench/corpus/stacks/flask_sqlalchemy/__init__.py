"""The Flask + SQLAlchemy 2 ORM service (``app``), its own source checkout for the code locator."""

from bench.corpus.stacks.flask_sqlalchemy.app import STACK, plans, start

__all__ = ["STACK", "plans", "start"]
