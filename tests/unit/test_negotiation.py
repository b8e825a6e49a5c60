"""The resume decision of a stream, table-driven (no database)."""

from __future__ import annotations

import pytest

from lr_server.negotiation import Action, decide

# sink, cursor, trimmed through, head, provider -> action, resume after, first missing
CASES = [
    ("caught up", 20, 20, 20, 20, False, Action.RESUME, 20, 0),
    ("first contact, empty sink", 0, 0, 0, 0, False, Action.RESUME, 0, 0),
    ("sink ahead of its cursor (acks lost)", 25, 20, 20, 30, False, Action.RESUME, 25, 0),
    ("behind the cursor, nothing trimmed", 5, 20, 0, 30, True, Action.RESUME, 5, 0),
    ("behind the cursor, trimmed up to it", 5, 20, 5, 30, False, Action.RESUME, 5, 0),
    ("behind the trim point, provider", 5, 20, 6, 30, True, Action.FULL_SYNC, 5, 6),
    ("behind the trim point, no provider", 5, 20, 20, 30, False, Action.STOP, 5, 6),
    ("empty sink behind the trim point", 0, 20, 20, 30, False, Action.STOP, 0, 1),
    ("sink past the source's head, provider", 40, 20, 20, 30, True, Action.FULL_SYNC, 20, 21),
    ("sink past the source's head, no provider", 40, 20, 0, 30, False, Action.STOP, 20, 21),
    ("cursor past a restored head", 40, 35, 0, 30, False, Action.STOP, 30, 31),
    ("cursor lowered to the sink, trimmed past it", 5, 5, 20, 30, False, Action.STOP, 5, 6),
]

ACCEPTED = [
    ("at the accepted point", 5, 20, None, Action.RESUME),
    ("past it", 12, 20, None, Action.RESUME),
    ("trimmed further since", 5, 30, 6, Action.STOP),
    ("behind the accepted point", 3, 20, 4, Action.STOP),
]


@pytest.mark.parametrize(
    ("sink", "cursor", "trimmed", "head", "provider", "action", "after", "missing"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    sink: int,
    cursor: int,
    trimmed: int,
    head: int,
    provider: bool,
    action: Action,
    after: int,
    missing: int,
) -> None:
    d = decide(sink, cursor, trimmed, head, provider)
    assert (d.action, d.resume_after) == (action, after)
    if action is Action.RESUME:
        assert d.reason == ""
    else:
        assert d.first_missing == missing
        assert d.reason


@pytest.mark.parametrize(
    ("sink", "trimmed", "missing", "action"),
    [c[1:] for c in ACCEPTED],
    ids=[c[0] for c in ACCEPTED],
)
def test_decide_after_an_accepted_loss(
    sink: int, trimmed: int, missing: int | None, action: Action
) -> None:
    # An operator accepted the loss after position 5 when the trim mark was 20.
    d = decide(sink, 40, trimmed, 50, False, accepted=(5, 20))
    assert d.action is action
    if missing is not None:
        assert d.first_missing == missing
