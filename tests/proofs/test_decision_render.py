"""The judge's decision is a value; its reason is written from that value alone by the renderer."""

from __future__ import annotations

from dataclasses import replace

from processors.connectors.proofs.decision import Decision, Rule
from processors.connectors.proofs.render import RULES, reason
from processors.connectors.proofs.tallies import Matched
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED
from processors.model.verdict import Receipt

RECEIPT = Receipt(before_errors=10, before_requests=200, after_errors=0, after_requests=150, test="t", p_value=0.004,
                  interval=None, must_start_seen=3, still_happens_at=[], requests_needed=0, window_start_unix_ms=0.0,
                  window_end_unix_ms=1.0)  # fmt: skip
FIXED_DECISION = Decision(outcome=FIXED, rule=Rule.DROPPED, signature="finding:n_plus_one:fp", service="shop",
                          version="1.1", after=Matched(0, 150, []), receipt=RECEIPT, before=Matched(10, 200, []),
                          before_version="1.0", floor=59, needed=120, p_value=0.004, must_start="fix.ran",
                          must_seen=3)  # fmt: skip


def test_every_rule_has_its_sentence() -> None:
    """A rule without a renderer would fail at the first verdict it decides."""
    assert set(RULES) == set(Rule)


def test_a_fixed_decision_reads_with_its_numbers() -> None:
    """The reason names the signature, the requests, the before counts, the test and the must-start event."""
    assert reason(FIXED_DECISION) == (
        "'finding:n_plus_one:fp' not seen in 150 requests of 1.1 (before: 10/200 on 1.0): p = 0.004 <= 0.025 "
        "(alpha 0.05 over 2 looks), floor 59 from the before rate's upper bound; 'fix.ran' seen 3 time(s)"
    )


def test_the_sampling_gate_changes_the_decision_and_the_renderer_says_why() -> None:
    """An outcome the sampling forbids becomes INSUFFICIENT with the rule's own sentence kept after the reason."""
    gated = replace(FIXED_DECISION, outcome=INSUFFICIENT, sampling="sampling differs", unweighted=FIXED)
    assert reason(gated) == f"sampling differs; so no FIXED (unweighted, it read: {reason(FIXED_DECISION)})"
    short = replace(FIXED_DECISION, outcome=INSUFFICIENT, rule=Rule.SHORT, after=Matched(0, 20, []), watch_s=60)
    assert reason(short) == ("20 of the 120 requests needed (before: 10/200 on 1.0; floor 59, test at 0.025) in 60s "
                             "of 1.1: 100 more")  # fmt: skip
    assert reason(replace(short, sampling="sampling differs")).startswith("sampling differs; and 20 of the 120")


def test_a_recurrence_names_where_it_still_happens() -> None:
    recurs = replace(FIXED_DECISION, outcome=NOT_FIXED, rule=Rule.RECURS, after=Matched(2, 50, ["POST /cart"]))
    assert reason(recurs) == "'finding:n_plus_one:fp' still happens on 1.1: 2 of 50 requests, at POST /cart " \
        "(before: 10/200 on 1.0)"  # fmt: skip
