"""The failure policy's rules without I/O: attempts, back-off, the bisection, the release order."""

from __future__ import annotations

import pytest

from lr_client.errors import InvalidInputError
from lr_client.failure_policy import Bisection, FailurePolicy, OnFailure, backoff, releasable
from lr_client.listener import RoutingQueueMessage
from lr_client.records import ReplicationType
from lr_client.store.recv.parked import OpenRow, ParkedState


def msg(position: int, key: bytes | None = None) -> RoutingQueueMessage:
    return RoutingQueueMessage(b"", "a", "c", position, ReplicationType.LOG_ENTRY_SYNC, key=key)


def search(messages: list[RoutingQueueMessage], bad: set[int], held: set[bytes] = set()):  # noqa: B006
    """Run a bisection against a listener failing any group holding a position in ``bad``."""
    b = Bisection(messages, held)
    tries = 0
    while (group := b.next()) is not None:
        tries += 1
        if bad & {messages[i].source_position for i in group}:
            b.failed("boom")
        else:
            b.ok()
    return b, tries


def test_the_default_blocks_after_five_attempts_and_names_are_checked() -> None:
    policy = FailurePolicy()
    assert policy.on_failure is OnFailure.BLOCK and policy.max_attempts == 5
    assert not policy.parks and not policy.isolates(10)
    assert [policy.exhausted(n) for n in (0, 4, 5, 6)] == [False, False, True, True]
    park = FailurePolicy("park", 3)
    assert park.parks and [park.isolates(n) for n in (1, 2, 3)] == [False, False, True]
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidInputError, match="max_attempts"):
            FailurePolicy("park", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'block', 'park'"):
        FailurePolicy("skip")


def test_backoff_doubles_from_initial_up_to_its_cap() -> None:
    assert [backoff(n, 0.5, 3.0) for n in (1, 2, 3, 4, 9)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_one_poison_among_a_thousand_is_found_alone_in_logarithmic_tries() -> None:
    messages = [msg(p) for p in range(1, 1001)]
    b, tries = search(messages, {437})
    assert [messages[i].source_position for i, _ in b.parked] == [437]
    assert sorted(b.applied) == [i for i in range(1000) if i != 436]
    assert b.applied == sorted(b.applied)  # applied in order
    assert tries <= 2 * 10 + 1


def test_several_poisons_are_each_parked_and_the_rest_applied_once() -> None:
    messages = [msg(p) for p in range(1, 17)]
    b, _ = search(messages, {1, 8, 16})
    assert [messages[i].source_position for i, _ in b.parked] == [1, 8, 16]
    assert len(b.applied) == len(set(b.applied)) == 13


def test_later_entries_of_a_parked_key_are_held_earlier_ones_applied() -> None:
    keys = [b"k", b"x", b"k", b"k", None, b"x"]
    messages = [msg(p, k) for p, k in enumerate(keys, start=1)]
    b, _ = search(messages, {3})
    assert [messages[i].source_position for i, _ in b.parked] == [3]
    assert [messages[i].source_position for i in b.held] == [4]
    assert sorted(messages[i].source_position for i in b.applied) == [1, 2, 5, 6]


def test_keys_held_already_are_held_without_a_call() -> None:
    messages = [msg(1, b"k"), msg(2, b"x"), msg(3, b"k")]
    b, tries = search(messages, set(), held={b"k"})
    assert (b.held, b.applied, b.parked, tries) == ([0, 2], [1], [], 1)


def row(i: int, key: bytes | None, state: ParkedState) -> OpenRow:
    return OpenRow(i, i, key, state, i, 1)


def test_released_rows_are_those_no_parked_row_of_their_key_precedes() -> None:
    p, h, r = ParkedState.PARKED, ParkedState.HELD, ParkedState.RETRYING
    rows = [row(1, b"a", p), row(2, b"a", h), row(3, b"b", r), row(4, b"b", h)]
    rows += [row(5, None, p), row(6, None, r), row(7, b"c", h)]
    assert [x.parked_id for x in releasable(rows)] == [3, 4, 6, 7]
