"""Builds without a version bump: service.version > commit > image digest > deploy mark, decoded and judged."""

from __future__ import annotations

from dataclasses import replace

import pytest
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from processors.connectors.proofs.config import ProofConfig
from processors.connectors.proofs.desk import FACTORY, ProofDesk
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.marks import DeployMark
from processors.connectors.proofs.verdicts import FIXED, verdicts_by_version
from processors.model.contract import ProofContract
from processors.model.events import Resource
from processors.model.outputs import VerdictEvent, parse_event, register
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from streamer.decode import decode_traces_json, decode_traces_proto
from streamer.deploy_cli import parse_at
from streamer.runtime.pins import PinTracker
from tests.otlp_factory import to_json, to_proto
from tests.regressions.builders import MS, SERVICE, T0, S, request

SHA_A, SHA_B = "a" * 40, "b" * 40
DIGEST = "sha256:" + "d" * 64


def _decoded(attributes: dict[str, object]) -> list[Resource]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=SdkResource.create({"service.name": "shop", **attributes}))  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tests.proofs").start_as_current_span("GET /"):
        pass
    spans = exporter.get_finished_spans()
    return [s.resource for s in (*decode_traces_proto(to_proto(spans)), *decode_traces_json(to_json(spans)))]


@pytest.mark.parametrize(
    ("attributes", "build", "how"),
    [
        ({"service.version": "1.2", "vcs.ref.head.revision": SHA_A, "oci.manifest.digest": DIGEST}, "1.2", "version"),
        ({"vcs.ref.head.revision": SHA_A, "oci.manifest.digest": DIGEST}, SHA_A, "commit"),
        ({"vcs.repository.ref.revision": SHA_B}, SHA_B, "commit"),  # the attribute's older name
        ({"oci.manifest.digest": DIGEST, "container.image.id": "sha256:other"}, DIGEST, "digest"),
        ({"container.image.repo_digests": ["registry.example/shop@" + DIGEST]}, DIGEST, "digest"),
        ({"container.image.id": DIGEST}, DIGEST, "digest"),
        ({"deployment.environment.name": "prod"}, "", ""),
    ],
)
def test_the_decoders_identify_the_build_by_version_then_commit_then_digest(
    attributes: dict[str, object], build: str, how: str
) -> None:
    """Both encodings give ``version`` = the build identity and say how it was found; the attributes are kept."""
    for resource in _decoded(attributes):
        assert (resource.version, resource.identified_by) == (build, how)
        assert resource.revision == attributes.get(
            "vcs.ref.head.revision", attributes.get("vcs.repository.ref.revision", "")
        )


def _as(trace: ClosedTrace, resource: Resource) -> ClosedTrace:
    """The trace as sent by a build with ``resource``."""
    fields = Span.__match_args__
    spans = tuple(Span(*(resource if f == "resource" else getattr(s, f) for f in fields)) for s in trace.spans)
    return replace(trace, spans=spans)


CONTRACT = ProofContract(signature="error:*:RoundingError", fingerprint="fp-id", watch_s=60, min_requests=59,
                         baseline_rate=0.05, service=SERVICE)  # fmt: skip


def _judge(judge: ProofJudge, builds: list[tuple[Resource, int, bool]]) -> list[VerdictEvent]:
    """Each build serves 200 requests from its start (every 10th fails with RoundingError when buggy)."""
    judge.on_contract(CONTRACT)
    out: list[VerdictEvent] = []
    for resource, start, buggy in builds:
        for j in range(200):
            exception = "RoundingError" if buggy and j % 10 == 9 else ""
            judge.on_trace(_as(request(start + j * 100 * MS, "x", exception=exception), resource))
    for tick in range(0, 300):
        out += judge.close_until(T0 + tick * S)
    return out


def test_a_service_without_service_version_is_judged_across_two_commits() -> None:
    """The builds are the commits: FIXED on the second, and the receipt says the build was told by its commit."""
    a = Resource(SERVICE, SHA_A, "prod", SHA_A)
    b = Resource(SERVICE, SHA_B, "prod", SHA_B)
    verdicts = _judge(ProofJudge(), [(a, T0, True), (b, T0 + 100 * S, False)])
    assert verdicts_by_version(verdicts) == {SHA_B: [FIXED]}
    assert verdicts[0].commit == SHA_B and verdicts[0].receipt.build_identified_by == "commit"


def test_a_deploy_mark_splits_a_service_that_names_no_build() -> None:
    """Without any build attribute, the telemetry after a mark is the mark's build; the receipt says "mark"."""
    judge = ProofJudge()
    judge.on_mark(DeployMark(service=SERVICE, at_unix_ms=(T0 + 100 * S) / 1e6, name="v2"))
    bare = Resource(SERVICE, "", "prod")
    verdicts = _judge(judge, [(bare, T0, True), (bare, T0 + 100 * S, False)])
    assert verdicts_by_version(verdicts) == {"v2": [FIXED]}
    assert verdicts[0].receipt.build_identified_by == "mark"


def test_without_a_mark_an_unnamed_build_never_gets_a_verdict() -> None:
    """The case the marks are for: the same traffic without one is a single build, never judged."""
    bare = Resource(SERVICE, "", "prod")
    assert _judge(ProofJudge(), [(bare, T0, True), (bare, T0 + 100 * S, False)]) == []


def test_a_mark_round_trips_as_an_event_and_names_itself_by_time() -> None:
    """The CLI's record parses back (the desk's topic reader); an unnamed mark is named after its UTC time."""
    mark = DeployMark(service="shop", at_unix_ms=parse_at("2026-12-06T03:00:00Z", 0.0))
    register(*FACTORY.events)  # as the daemon does for every component it builds
    assert parse_event(mark.model_dump_json().encode()) == mark
    assert mark.build == "deploy@2026-12-06T03:00:00Z"
    assert parse_at("1796526000", 0.0) == mark.at_unix_ms and parse_at(None, 5.0) == 5000.0


def test_the_desk_keeps_a_mark_as_state_that_holds_its_record_and_bounds_them() -> None:
    """A mark pins the offset of its record (a restart reads it again); past ``max_marks`` the oldest is forgotten,
    counted, and no longer splits the service."""
    pins = PinTracker()
    desk = ProofDesk(ProofConfig(max_marks=1), events=pins)
    first = DeployMark(service=SERVICE, at_unix_ms=1000.0, name="v2")
    pins.feeding(("contracts/0", 7))
    desk.on_event(first, "contracts/0")
    assert pins.pins.pinned("contracts/0") == 1 and desk.judge.marks.build_at(SERVICE, 2 * 10**9) == "v2"
    pins.feeding(("contracts/0", 8))
    desk.on_event(DeployMark(service="other", at_unix_ms=1000.0, name="v9"), "contracts/0")
    assert desk.telemetry.dropped["max_marks"] == 1 and desk.judge.marks.build_at(SERVICE, 2 * 10**9) == ""
