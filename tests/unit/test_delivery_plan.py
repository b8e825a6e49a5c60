"""The delivery plan: which callbacks the head of a receive queue makes (no database)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from lr_client.delivery import PlanKind, awaits_end, messages, plan_delivery, run_length
from lr_client.errors import ProtocolError
from lr_client.headers import EMPTY, encode_headers
from lr_client.listener import RoutingQueueMessage
from lr_client.records import HeadEntry, QueueInfo, ReplicationType, SubscriberState
from lr_client.replayed import REPLAYED_MARK

LOG = ReplicationType.LOG_ENTRY_SYNC
SNAP = ReplicationType.SNAPSHOT_SYNC
END = ReplicationType.LAST_FULL_SYNC_ENTRY
DROPPED = ReplicationType.STREAM_DROPPED
QUEUE = QueueInfo(7, "LRQ_Recv_policy__site-a", "policy", "site-a")


def head(*items: tuple[ReplicationType, int, str]) -> list[HeadEntry]:
    """Entries with seqs 10, 11, ...: (type, source position, snapshot id)."""
    return [
        HeadEntry(10 + i, t, pos, sid, b"%s-%d" % (sid.encode(), pos))
        for i, (t, pos, sid) in enumerate(items)
    ]


IDLE = SubscriberState(7)
IN_S1 = SubscriberState(7, snapshot_id="s1", in_snapshot=True)
ENDED_S1 = SubscriberState(7, snapshot_id="s1", in_snapshot=False)

CASES = [
    pytest.param(
        IDLE,
        head((LOG, 3, ""), (LOG, 5, ""), (SNAP, 1, "s1")),
        (PlanKind.LOG, [10, 11], [3, 5], "", False, False, False),
        id="a-run-of-log-entries-stops-at-a-snapshot",
    ),
    pytest.param(
        IN_S1,
        head((LOG, 3, "")),
        (PlanKind.LOG, [10], [3], "s1", False, False, True),
        id="log-entries-keep-the-snapshot-state",
    ),
    pytest.param(
        IDLE,
        head((SNAP, 1, "s1"), (SNAP, 2, "s1"), (LOG, 9, "")),
        (PlanKind.SNAPSHOT, [10, 11], [1, 2], "s1", True, False, True),
        id="a-snapshot-starts-and-its-run-stops-at-another-type",
    ),
    pytest.param(
        IN_S1,
        head((SNAP, 3, "s1"), (END, 4, "s1"), (LOG, 9, "")),
        (PlanKind.SNAPSHOT, [10, 11], [3], "s1", False, True, False),
        id="a-started-snapshot-continues-and-its-end-is-taken-with-it",
    ),
    pytest.param(
        IN_S1,
        head((END, 4, "s1")),
        (PlanKind.SNAPSHOT, [10], [], "s1", False, True, False),
        id="an-end-alone-ends-the-started-snapshot",
    ),
    pytest.param(
        IDLE,
        head((SNAP, 1, "s2"), (END, 2, "s1")),
        (PlanKind.SNAPSHOT, [10], [1], "s2", True, False, True),
        id="another-snapshots-end-is-not-this-ones",
    ),
    pytest.param(
        IN_S1,
        head((SNAP, 1, "s2"), (SNAP, 2, "s2")),
        (PlanKind.SNAPSHOT, [10, 11], [1, 2], "s2", True, False, True),
        id="a-new-snapshot-restarts-over-an-unfinished-one",
    ),
    pytest.param(
        IDLE,
        head((SNAP, 1, "s1"), (SNAP, 2, "s2")),
        (PlanKind.SNAPSHOT, [10], [1], "s1", True, False, True),
        id="a-run-holds-one-snapshot-only",
    ),
    pytest.param(
        ENDED_S1,
        head((SNAP, 2, "s1"), (END, 3, "s1"), (SNAP, 1, "s2")),
        (PlanKind.STALE, [10, 11], [], "s1", False, False, False),
        id="left-overs-of-a-delivered-snapshot-are-stale",
    ),
    pytest.param(
        IN_S1,
        head((DROPPED, 5, ""), (LOG, 6, "")),
        (PlanKind.DROP, [10], [5], "s1", False, False, True),
        id="a-drop-notice-comes-alone-and-keeps-the-state",
    ),
]


@pytest.mark.parametrize(("state", "entries", "expected"), CASES)
def test_the_plan_for_the_head_of_a_queue(
    state: SubscriberState,
    entries: list[HeadEntry],
    expected: tuple[PlanKind, list[int], list[int], str, bool, bool, bool],
) -> None:
    plan = plan_delivery(QUEUE, state, entries)
    kind, seqs, positions, sid, start, end, in_snapshot = expected
    assert (plan.kind, plan.seqs, plan.snapshot_id) == (kind, seqs, sid)
    assert [m.source_position for m in plan.messages] == positions
    assert (plan.start, plan.end, plan.in_snapshot) == (start, end, in_snapshot)


def test_messages_carry_the_entry_and_its_queue() -> None:
    entries = head((SNAP, 1, "s1"))
    (message,) = plan_delivery(QUEUE, IDLE, entries).messages
    assert (message.source_id, message.client_name) == ("site-a", "policy")
    assert (message.payload, message.type, message.snapshot_id) == (b"s1-1", SNAP, "s1")


def test_messages_are_the_dataclass_built_from_each_entry() -> None:
    entry = HeadEntry(7, SNAP, 3, "s1", b"row", 9, b"k")
    (message,) = messages(QUEUE, [entry])
    built = RoutingQueueMessage(b"row", "site-a", "policy", 3, SNAP, "s1", b"k")
    assert message == built and hash(message) == hash(built)
    assert repr(message) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.payload = b"other"  # type: ignore[misc]


def test_an_unknown_entry_type_is_a_protocol_error() -> None:
    odd = head((ReplicationType.NONE, 1, ""))
    with pytest.raises(ProtocolError, match="entry seq 10 has type NONE"):
        plan_delivery(QUEUE, IDLE, odd)


@pytest.mark.parametrize(
    ("types", "sid", "expected"),
    [
        ((LOG,), None, 2),
        ((SNAP,), "s1", 0),
        ((LOG, SNAP), None, 5),
        ((LOG, SNAP), "", 2),
        ((SNAP, LOG), "s1", 0),
    ],
)
def test_run_length_counts_leading_entries_of_the_types_and_snapshot(
    types: tuple[ReplicationType, ...], sid: str | None, expected: int
) -> None:
    entries = head((LOG, 1, ""), (LOG, 2, ""), (SNAP, 1, "s1"), (SNAP, 2, "s1"), (LOG, 3, ""))
    assert run_length(entries, types, sid) == expected


def _has_end(*ended: str) -> Callable[[str], bool]:
    asked: list[str] = []

    def has_end(sid: str) -> bool:
        asked.append(sid)
        return sid in ended

    has_end.asked = asked  # type: ignore[attr-defined]
    return has_end


@pytest.mark.parametrize(
    ("state", "entries", "ended", "expected", "asked"),
    [
        pytest.param(IDLE, [], (), False, [], id="an-empty-queue"),
        pytest.param(IDLE, head((LOG, 1, "")), (), False, [], id="a-log-entry"),
        pytest.param(IDLE, head((END, 3, "s1")), (), False, [], id="an-end-marker"),
        pytest.param(IDLE, head((SNAP, 1, "s1")), (), True, ["s1"], id="a-snapshot-without-end"),
        pytest.param(IDLE, head((SNAP, 1, "s1")), ("s1",), False, ["s1"], id="its-end-is-queued"),
        pytest.param(IDLE, head((SNAP, 1, "s2")), ("s1",), True, ["s2"], id="another-ones-end"),
        pytest.param(IN_S1, head((SNAP, 3, "s1")), (), True, ["s1"], id="a-started-one"),
        pytest.param(ENDED_S1, head((SNAP, 2, "s1")), (), False, [], id="left-overs-wait-not"),
    ],
)
def test_a_snapshot_at_the_head_waits_for_its_end_unless_it_was_delivered(
    state: SubscriberState,
    entries: list[HeadEntry],
    ended: tuple[str, ...],
    expected: bool,
    asked: list[str],
) -> None:
    has_end = _has_end(*ended)
    assert awaits_end(state, entries[0] if entries else None, has_end) is expected
    assert has_end.asked == asked  # type: ignore[attr-defined]


def test_a_replayed_entry_is_marked_and_carries_no_snapshot_id() -> None:
    again = HeadEntry(3, LOG, 5, REPLAYED_MARK, b"again")
    fresh = HeadEntry(4, LOG, 6, "", b"fresh")
    replayed, first_time = messages(QUEUE, [again, fresh])
    assert (replayed.replayed, replayed.snapshot_id, replayed.source_position) == (True, "", 5)
    assert (first_time.replayed, first_time.snapshot_id) == (False, "")


def test_messages_carry_each_entrys_key_and_decoded_headers() -> None:
    with_both = HeadEntry(3, LOG, 5, "", b"a", None, b"k1", encode_headers({"trace": "t1"}))
    without = HeadEntry(4, LOG, 6, "", b"b")
    first, second = messages(QUEUE, [with_both, without])
    assert (first.key, dict(first.headers)) == (b"k1", {"trace": "t1"})
    assert (second.key, second.headers) == (None, EMPTY)


def test_a_log_plan_takes_its_first_entrys_receive_time_and_no_base() -> None:
    run = [HeadEntry(10, LOG, 3, "", b"a", received_at=5.5), HeadEntry(11, LOG, 4, "", b"b")]
    plan = plan_delivery(QUEUE, IDLE, run)
    assert (plan.received_at, plan.base_position) == (5.5, None)


@pytest.mark.parametrize(
    ("entries", "base"),
    [
        pytest.param([HeadEntry(10, SNAP, 1, "s1", b"a", 40)], 40, id="the-runs-first-entrys"),
        pytest.param(
            [HeadEntry(10, SNAP, 1, "s1", b"a", None), HeadEntry(11, END, 2, "s1", b"", 41)],
            41,
            id="the-end-markers-when-it-is-taken",
        ),
        pytest.param([HeadEntry(10, END, 2, "s1", b"", 42)], 42, id="an-end-markers-alone"),
        pytest.param(
            [HeadEntry(10, SNAP, 1, "s1", b"a", 40), HeadEntry(11, END, 2, "s2", b"", 41)],
            40,
            id="not-another-snapshots-end",
        ),
    ],
)
def test_a_snapshot_plan_carries_the_base_position_its_entries_sent(
    entries: list[HeadEntry], base: int | None
) -> None:
    plan = plan_delivery(QUEUE, IN_S1, entries)
    assert (plan.base_position, plan.received_at) == (base, 0.0)


def test_a_drop_notice_is_delivered_alone_with_its_own_fields() -> None:
    entries = [HeadEntry(10, DROPPED, 5, "", b"gone"), HeadEntry(11, DROPPED, 6, "", b"too")]
    plan = plan_delivery(QUEUE, IN_S1, entries)
    (notice,) = plan.messages
    assert (notice.type, notice.payload, notice.source_position) == (DROPPED, b"gone", 5)
    assert (plan.seqs, plan.base_position, plan.received_at) == ([10], None, 0.0)
