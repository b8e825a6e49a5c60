"""The batches a branch forwards before it stores them (:mod:`lr_server.sending.relay_inbox`) and
where its relay reads start (:mod:`lr_client.store.relay_marks`)."""

from __future__ import annotations

import pytest

from lr_client.records import ReplicationType, WireEntry
from lr_client.store.byte_bounds import ENTRY_OVERHEAD
from lr_client.store.relay_marks import RelayMarks
from lr_server.sending.relay_inbox import RelayInbox

LOG = ReplicationType.LOG_ENTRY_SYNC


def entries(*positions: int, size: int = 4) -> list[WireEntry]:
    return [
        WireEntry(p, LOG, bytes([p % 256]) * size, key=b"k", origin_time=100.0 + p)
        for p in positions
    ]


def positions(got: list) -> list[int]:  # type: ignore[type-arg]
    return [e.position for e in got]


def test_a_batch_is_taken_by_the_stream_it_follows_with_its_entries_unchanged() -> None:
    inbox = RelayInbox(8, 1 << 20)
    assert inbox.put("c", 10, entries(12, 15))
    assert inbox.take("c", 9, 100, 1 << 20) == []  # the stream lacks what follows 9
    assert inbox.take("other", 10, 100, 1 << 20) == []
    got = inbox.take("c", 10, 100, 1 << 20)
    assert positions(got) == [12, 15]
    first = got[0]
    assert (first.client_name, first.type, first.payload, first.key, first.created_at) == (
        "c",
        LOG,
        b"\x0c" * 4,
        b"k",
        112.0,
    )
    assert len(inbox) == 0 and inbox.nbytes == 0  # all of it taken: let go


def test_a_stream_inside_a_batch_takes_only_what_follows_it() -> None:
    """Every entry of the client after ``previous`` is in the batch: the entries past the
    stream's position are its next ones, whatever came before."""
    inbox = RelayInbox(8, 1 << 20)
    inbox.put("c", 0, entries(3, 5, 8))
    assert positions(inbox.take("c", 5, 100, 1 << 20)) == [8]
    assert len(inbox) == 0


def test_batches_wholly_behind_the_stream_are_let_go_and_a_gap_is_not_bridged() -> None:
    inbox = RelayInbox(8, 1 << 20)
    inbox.put("c", 0, entries(1, 2))
    inbox.put("c", 4, entries(5, 6))  # 3 and 4 were never received here
    assert inbox.take("c", 2, 100, 1 << 20) == []  # the batch after 2 is missing
    assert len(inbox) == 1  # (0, 2] let go; (4, 6] kept for when the stream reaches 4
    assert positions(inbox.take("c", 4, 100, 1 << 20)) == [5, 6]


def test_a_take_keeps_to_the_batch_limits_and_leaves_the_rest_for_the_next() -> None:
    inbox = RelayInbox(8, 1 << 20)
    inbox.put("c", 0, entries(1, 2, 3, 4, 5, size=100))
    assert positions(inbox.take("c", 0, 2, 1 << 20)) == [1, 2]
    # By bytes: two entries fit, a third does not; the first always goes.
    two = 2 * (100 + ENTRY_OVERHEAD)
    assert positions(inbox.take("c", 2, 100, two)) == [3, 4]
    assert positions(inbox.take("c", 4, 100, 1)) == [5]
    assert len(inbox) == 0


def test_only_batches_of_log_entries_are_kept() -> None:
    inbox = RelayInbox(8, 1 << 20)
    end = WireEntry(3, ReplicationType.LAST_FULL_SYNC_ENTRY, b"", snapshot_id="s")
    assert not inbox.put("c", 0, [*entries(1, 2), end])
    assert not inbox.put("c", 0, [])
    assert len(inbox) == 0


@pytest.mark.parametrize("bound", ["batches", "bytes"])
def test_the_inbox_is_bounded_and_lets_the_oldest_batch_go(bound: str) -> None:
    inbox = RelayInbox(2, 1 << 20) if bound == "batches" else RelayInbox(100, 250)
    for n in range(3):
        assert inbox.put("c", n, entries(n + 1, size=100))
    assert len(inbox) == 2 and inbox.nbytes == 200
    assert inbox.take("c", 0, 10, 1 << 20) == []  # (0, 1] went first
    assert positions(inbox.take("c", 1, 10, 1 << 20)) == [2]
    assert not RelayInbox(8, 50).put("c", 0, entries(1, size=51))  # larger than it all


def test_clear_lets_every_batch_go() -> None:
    inbox = RelayInbox(8, 1 << 20)
    inbox.put("c", 0, entries(1))
    inbox.put("d", 0, entries(1))
    inbox.clear()
    assert len(inbox) == 0 and inbox.nbytes == 0
    assert inbox.take("c", 0, 10, 1 << 20) == []


def test_a_relay_read_starts_at_the_mark_of_its_position_or_the_nearest_below() -> None:
    marks = RelayMarks(limit=3)
    assert marks.start(1, 10) == (0, False)  # no mark: the relay's start
    marks.note(1, 10, 500)
    marks.note(1, 20, 700)
    marks.note(2, 15, 900)  # another queue's
    assert marks.start(1, 10) == (500, True)
    assert marks.start(1, 17) == (500, False)  # 10's mark bounds a read after 17 too
    assert marks.start(1, 25) == (700, False)
    assert marks.start(1, 5) == (0, False)  # a mark above the position says nothing
    marks.note(1, 10, 450)  # a weaker note does not lower a mark
    assert marks.start(1, 10) == (500, True)
    marks.note(1, 30, 800)  # at the limit: the oldest mark goes
    assert len(marks) == 3
    assert marks.start(1, 10) == (0, False)
    assert marks.start(1, 30) == (800, True)
