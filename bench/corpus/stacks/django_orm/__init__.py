"""The Django ORM service (``app``: models, views and URLs in one module), its own source checkout for the code
locator. Importing it configures Django for this process (``settings.configure``)."""

from bench.corpus.stacks.django_orm.app import STACK, plans, start

__all__ = ["STACK", "plans", "start"]
