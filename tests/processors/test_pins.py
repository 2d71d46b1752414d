"""OffsetPins: which input offsets are still needed, and therefore what may be committed."""

from __future__ import annotations

from processors.pins import OffsetPins

TP = ("otlp_spans", 0)
OTHER = ("otlp_spans", 1)


def test_nothing_pinned_commits_the_position() -> None:
    """With no pins the consumer position itself is committable."""
    pins = OffsetPins()
    assert pins.committable(TP, 42) == 42
    assert pins.oldest(TP) is None
    assert pins.pinned(TP) == 0


def test_oldest_pin_bounds_the_committable_offset() -> None:
    """The committable offset is the oldest pinned offset, never beyond the position."""
    pins = OffsetPins()
    pins.pin([(TP, 7), (TP, 3), (TP, 5)])
    assert pins.oldest(TP) == 3
    assert pins.committable(TP, 10) == 3
    assert pins.committable(TP, 2) == 2  # a position behind every pin wins
    assert pins.pinned(TP) == 3


def test_overlapping_pins_are_reference_counted() -> None:
    """An offset pinned twice (two open traces) stays pinned until both references are released."""
    pins = OffsetPins()
    pins.pin([(TP, 3), (TP, 3), (TP, 5)])
    pins.release([(TP, 3)])
    assert pins.committable(TP, 10) == 3
    pins.release([(TP, 3)])
    assert pins.committable(TP, 10) == 5
    pins.release([(TP, 5)])
    assert pins.committable(TP, 10) == 10
    assert pins.pinned(TP) == 0


def test_release_out_of_order_only_moves_past_fully_released_offsets() -> None:
    """Releasing a newer offset first keeps the older one as the bound; releasing the older one then jumps ahead."""
    pins = OffsetPins()
    pins.pin([(TP, 1), (TP, 2), (TP, 3)])
    pins.release([(TP, 3)])
    assert pins.committable(TP, 4) == 1
    pins.release([(TP, 2)])
    assert pins.committable(TP, 4) == 1
    pins.release([(TP, 1)])
    assert pins.committable(TP, 4) == 4


def test_repin_after_release_is_tracked_again() -> None:
    """An offset released and pinned again (a later trace took it as input) bounds the commit again."""
    pins = OffsetPins()
    pins.pin([(TP, 4)])
    pins.release([(TP, 4)])
    assert pins.committable(TP, 9) == 9
    pins.pin([(TP, 4)])
    assert pins.committable(TP, 9) == 4
    pins.release([(TP, 4)])
    assert pins.committable(TP, 9) == 9


def test_release_of_unknown_sources_is_ignored() -> None:
    """Releasing offsets never pinned (or of an unknown partition) changes nothing and never goes negative."""
    pins = OffsetPins()
    pins.pin([(TP, 2)])
    pins.release([(TP, 1), (OTHER, 2), (("nope", 9), 0)])
    assert pins.committable(TP, 5) == 2
    pins.release([(TP, 2), (TP, 2)])  # one release too many
    pins.pin([(TP, 2)])
    assert pins.committable(TP, 5) == 2  # the extra release did not pre-pay the new pin


def test_partitions_are_independent() -> None:
    """Pins of one partition do not hold back another."""
    pins = OffsetPins()
    pins.pin([(TP, 1), (OTHER, 8)])
    assert pins.committable(TP, 10) == 1
    assert pins.committable(OTHER, 10) == 8
    pins.release([(TP, 1)])
    assert pins.committable(TP, 10) == 10
    assert pins.committable(OTHER, 10) == 8


def test_forget_drops_every_pin_of_a_partition() -> None:
    """A revoked partition's pins are dropped; later releases of its offsets are harmless."""
    pins = OffsetPins()
    pins.pin([(TP, 1), (TP, 1), (TP, 2), (OTHER, 3)])
    pins.forget(TP)
    assert pins.pinned(TP) == 0
    assert pins.oldest(TP) is None
    assert pins.committable(TP, 6) == 6
    pins.release([(TP, 1), (TP, 2)])
    assert pins.committable(TP, 6) == 6
    assert pins.committable(OTHER, 6) == 3
    pins.forget(("never", 0))  # forgetting an unknown partition is a no-op


def test_total_counts_distinct_pinned_offsets_over_partitions() -> None:
    """The gauge's value: distinct pinned offsets over all partitions, not references."""
    pins = OffsetPins()
    pins.pin([(("t", 0), 1), (("t", 0), 1), (("t", 0), 2), (("t", 1), 7)])
    assert pins.total() == 3
    pins.release([(("t", 0), 1)])
    assert pins.total() == 3  # offset 1 still holds one reference
    pins.release([(("t", 0), 1), (("t", 0), 2)])
    assert pins.total() == 1
    pins.forget(("t", 1))
    assert pins.total() == 0
