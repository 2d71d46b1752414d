"""OffsetPins and PinTracker: which input offsets are still needed, and therefore what may be committed."""

from __future__ import annotations

from streamer.runtime.pins import OffsetPins, PinTracker

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


# ---- PinTracker: offsets from processor state ------------------------------------------------------------------


def test_a_retained_key_pins_the_record_being_processed_until_released_and_settled() -> None:
    """A key retained while a record is processed pins its offset; the release takes effect only once handed back."""
    t = PinTracker()
    t.feeding((TP, 3))
    t.retained("traces", "a")
    t.retained("traces", "a")  # the same record feeding the same key again pins nothing more
    assert t.committable(TP, 10) == 3
    t.released("traces", "a")
    assert t.committable(TP, 10) == 3  # not durable yet
    t.release(t.take_released())
    assert t.committable(TP, 10) == 10


def test_inherit_passes_a_closed_keys_input_on_to_what_it_feeds() -> None:
    """A window fed by a closed trace holds the trace's input after the trace itself released it."""
    t = PinTracker()
    for offset in (1, 2):
        t.feeding((TP, offset))
        t.retained("traces", "a")
    t.feeding(None)
    t.released("traces", "a")
    t.inherit("traces", "a")
    t.retained("calls", 0)
    t.feeding(None)
    t.release(t.take_released())
    assert t.committable(TP, 10) == 1
    assert t.held("calls", 0) == {(TP, 1)}  # the oldest of the partition: what the commit waits for
    t.released("calls", 0)
    t.release(t.take_released())
    assert t.committable(TP, 10) == 10


def test_nothing_being_processed_pins_nothing() -> None:
    """Retaining outside a record (watermark work with no inherited input) pins nothing."""
    t = PinTracker()
    t.feeding(None)
    t.retained("entities", "orders:1")
    assert t.total() == 0 and t.held("entities", "orders:1") == frozenset()


def test_forget_drops_a_revoked_partitions_input_from_every_key() -> None:
    """After a revocation no key holds that partition's offsets, and its pending releases are dropped too."""
    t = PinTracker()
    t.feeding((TP, 1))
    t.retained("traces", "a")
    t.feeding((OTHER, 7))
    t.retained("traces", "a")
    t.released("traces", "b")
    t.forget(TP)
    assert t.held("traces", "a") == {(OTHER, 7)}
    assert t.committable(TP, 5) == 5
    assert t.committable(OTHER, 9) == 7


def test_a_key_held_by_one_record_then_more_holds_each_once() -> None:
    """Most keys are held by the one record they came in (kept without a set); a second record and a repeat of
    either pin once each, and a revocation of the first record's partition leaves the key holding the second."""
    t = PinTracker()
    t.feeding((TP, 4))
    t.retained("history", "orders:1")
    t.retained("history", "orders:1")
    assert t.held("history", "orders:1") == {(TP, 4)} and t.total() == 1
    t.feeding((OTHER, 2))
    t.retained("history", "orders:1")
    t.feeding((TP, 4))
    t.retained("history", "orders:1")
    assert t.held("history", "orders:1") == {(TP, 4), (OTHER, 2)} and t.total() == 2
    t.feeding((TP, 9))
    t.retained("history", "orders:2")
    t.forget(TP)
    assert t.held("history", "orders:1") == {(OTHER, 2)} and t.held("history", "orders:2") == frozenset()
    t.released("history", "orders:1")
    t.release(t.take_released())
    assert t.committable(OTHER, 5) == 5 and t.total() == 0


def test_a_key_holds_the_oldest_offset_of_each_partition_that_fed_it() -> None:
    """Later records of a partition feeding a key pin nothing more (the commit waits for the oldest anyway); an
    older one (a replay) moves the key's hold back; each partition is held separately; releasing the key leaves
    what other keys hold."""
    t = PinTracker()
    for offset in (5, 6, 9):
        t.feeding((TP, offset))
        t.retained("traces", "a")
    assert t.held("traces", "a") == {(TP, 5)} and t.total() == 1 and t.committable(TP, 20) == 5
    t.feeding((TP, 3))  # an older record of the partition, replayed
    t.retained("traces", "a")
    assert t.held("traces", "a") == {(TP, 3)} and t.total() == 1 and t.committable(TP, 20) == 3
    for source in ((OTHER, 4), (OTHER, 2), (TP, 8), (OTHER, 7)):
        t.feeding(source)
        t.retained("traces", "a")
    assert t.held("traces", "a") == {(TP, 3), (OTHER, 2)} and t.total() == 2
    t.feeding((OTHER, 1))
    t.retained("traces", "a")
    assert t.held("traces", "a") == {(TP, 3), (OTHER, 1)} and t.committable(OTHER, 20) == 1
    t.feeding((TP, 9))
    t.retained("traces", "b")
    t.released("traces", "a")
    t.release(t.take_released())
    assert t.committable(TP, 20) == 9 and t.committable(OTHER, 20) == 20 and t.total() == 1
