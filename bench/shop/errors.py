"""The shop's exceptions. ``status`` is the HTTP status a request answers with; 4xx are business outcomes (the
server span keeps status UNSET), 5xx are failures (status ERROR and an ``exception`` event)."""

from __future__ import annotations


class ShopError(Exception):
    status = 500


class BusinessOutcome(ShopError):
    status = 409


class NotFound(BusinessOutcome):
    status = 404


class OrderNotPayable(BusinessOutcome):
    """The order is no longer 'pending' (already paid or cancelled)."""


class OutOfStock(BusinessOutcome):
    """No unit left to sell."""


class OrderChangedConcurrently(ShopError):
    """The post-commit audit saw that another transaction also changed the order (its write was clobbered)."""


class Oversold(ShopError):
    """Warehouse allocation after checkout found no unit: the stock counter went below zero."""


class IdempotencyKeyReused(ShopError):
    """The payment provider refused a second, different charge under the same idempotency key."""


class DependencyUnavailable(ShopError):
    """A dependency answered 503 on every attempt the shop made: the request fails with it."""

    status = 503


class UpstreamTimeout(ShopError):
    """A dependency did not answer within the request's timeout: the request fails fast (504)."""

    status = 504
