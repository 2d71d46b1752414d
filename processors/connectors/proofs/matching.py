"""What a contract's signature counts in a build's tally: its occurrences and the requests they are a rate of.

An error signature counts the failed requests of its routes; a latency signature the slow ones
(:mod:`~processors.connectors.proofs.latency`); an occurrence signature (a collision's, a finding's: see
:mod:`~processors.connectors.proofs.contracts`) the occurrences published under it, over the requests of the routes
they happened on and the contract's own routes (every request of the build when none is known). :class:`Occurrences`
remembers, per fingerprint, every signature it occurred under (a collision's functions may differ between
occurrences), and per signature the routes of its requests; both bounded by ``max_sites`` per key and by
``max_fingerprints`` keys (the desk's ``[proof] max_fingerprints``).
"""

from __future__ import annotations

from collections.abc import Iterable

from processors.api.telemetry import Telemetry
from processors.connectors.proofs.contracts import ErrorSignature, LatencySignature
from processors.connectors.proofs.latency import slow_requests
from processors.connectors.proofs.tallies import Bound, Matched, Tally
from processors.connectors.proofs.verdicts import ranked
from processors.state.lru import CountedLRU


class Occurrences:
    """The signatures of each fingerprint's occurrences, and the routes of each signature's requests: at most
    ``max_fingerprints`` of each, the least recently seen forgotten first (counted as ``max_occurrence_keys``)."""

    __slots__ = ("_routes", "_signatures", "max_sites")

    def __init__(self, max_sites: int, max_fingerprints: int = 100_000, telemetry: Telemetry | None = None) -> None:
        self.max_sites = max_sites
        self._signatures: CountedLRU[str, set[str]] = CountedLRU(max_fingerprints, telemetry, "max_occurrence_keys")
        self._routes: CountedLRU[str, set[str]] = CountedLRU(max_fingerprints, telemetry, "max_occurrence_keys")

    def remember(self, signature: str, fingerprint: str, routes: Iterable[str]) -> None:
        fps = self._signatures.get(fingerprint)
        if fps is None:
            self._signatures.put(fingerprint, fps := set())
        if len(fps) < self.max_sites:
            fps.add(signature)
        known = self._routes.get(signature)
        if known is None:
            self._routes.put(signature, known := set())
        for route in routes:
            if route and len(known) < self.max_sites:
                known.add(route)

    def signatures(self, bound: Bound) -> set[str]:
        return {str(bound.signature)} | (self._signatures.peek(bound.contract.fingerprint) or set())

    def routes(self, signatures: Iterable[str]) -> set[str]:
        return {r for s in signatures for r in self._routes.peek(s) or ()}


def matched(bound: Bound, t: Tally, occurrences: Occurrences) -> Matched:
    """The contract's occurrences in ``t``, the requests they are a rate of, and where they happened (most first)."""
    sig = bound.signature
    places: dict[str, int] = {}
    if isinstance(sig, ErrorSignature):
        requests = sum(n for (label, op), n in t.routes.items() if sig.matches_route(label, op))
        hits = {k: n for k, n in t.failures.items() if sig.matches_route(k[0], k[1]) and sig.matches_error(k[2])}
        for k in hits:
            for where, n in t.sites.get(k, {}).items():
                places[where] = places.get(where, 0) + n
        return Matched(sum(hits.values()), requests, ranked(places))
    if isinstance(sig, LatencySignature):
        return slow_requests(sig, t)
    sigs = occurrences.signatures(bound)
    routes = set(bound.contract.routes) | occurrences.routes(sigs)
    requests = sum(n for (label, op), n in t.routes.items() if label in routes or op in routes)
    for s in sigs:
        for where, n in t.collision_sites.get(s, {}).items():
            places[where] = places.get(where, 0) + n
    count = sum(t.collisions.get(s, 0) for s in sigs)
    # Each occurrence is a request of the traffic: a slice whose routes counted fewer (a job's requests, a route
    # named otherwise) still holds at least that many, so the rate never passes 1.
    return Matched(count, max(count, requests if routes else t.requests), ranked(places))
