"""The code locator: function, file and line of code that spans do not name (no ``code.*``), from stack traces, routes
and statement shapes in the service's checkout; see :mod:`processors.codeloc.locator`."""

from typing import TYPE_CHECKING

from processors.api.lazy import exports
from processors.codeloc.config import CodeLocConfig

if TYPE_CHECKING:
    from processors.codeloc.factory import build_locator
    from processors.codeloc.locator import CodeLocator, Site

__all__ = ["CodeLocConfig", "CodeLocator", "Site", "build_locator"]

# Imported on first use (libcst reads the checkout): a daemon without ``[codeloc] source_root`` never loads it.
__getattr__ = exports(
    __name__,
    {"processors.codeloc.factory": ("build_locator",), "processors.codeloc.locator": ("CodeLocator", "Site")},
)
