"""The code locator: function, file and line of code that spans do not name (no ``code.*``), from stack traces, routes
and statement shapes in the service's checkout; see :mod:`processors.codeloc.locator`."""

from processors.codeloc.config import CodeLocConfig
from processors.codeloc.factory import build_locator
from processors.codeloc.locator import CodeLocator, Site

__all__ = ["CodeLocConfig", "CodeLocator", "Site", "build_locator"]
