"""The resume decision of a stream and the plan of every client, table-driven (no database)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lr_client.records import (
    Cursor,
    DropRecord,
    SinkSnapshotState,
    SnapshotRequest,
    SnapshotStatus,
    StreamStop,
)
from lr_server.sending.negotiation import (
    Action,
    ClientFacts,
    ClientPlan,
    SinkState,
    Step,
    decide,
    plan,
    plan_client,
)

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
    assert d.resume_after == sink
    if missing is not None:
        assert d.first_missing == missing


# -- the plan of every client (plan_client), one row per rule ---------------------------------

OPEN = SnapshotRequest("s1", "b", "c", SnapshotStatus.READY, base_position=40)
RUNNING = replace(OPEN, status=SnapshotStatus.RUNNING)
OTHER = replace(OPEN, snapshot_id="s2")
DROP = DropRecord("b", "c", first_dropped_position=8, dropped_at=1.0, reason="too far behind")
STOPPED = StreamStop("b", "c", "lost", resume_after=5, stopped_at=1.0)
ACCEPTED_STOP = replace(STOPPED, accepted_at=2.0, accepted_through=20)
RESUMED_STOP = replace(ACCEPTED_STOP, resumed_at=3.0)
ONGOING, COMPLETED = SinkSnapshotState.ONGOING, SinkSnapshotState.COMPLETED
CAUGHT_UP = SinkState(10)


def at_sink(
    last: int = 10, state: int = SinkSnapshotState.NONE, sid: str = "", at: int = 0
) -> SinkState:
    return SinkState(last, state, sid, at)


def facts(
    sink: SinkState = CAUGHT_UP,
    cursor: int = 10,
    provider: bool = True,
    open_req: SnapshotRequest | None = None,
    drop: DropRecord | None = None,
    stop: StreamStop | None = None,
    needs_snapshot: bool = False,
    marks: tuple[int, int] | None = None,  # (trimmed through, head): the second call
) -> ClientFacts:
    trimmed, head = marks if marks is not None else (None, None)
    return ClientFacts(
        "c",
        provider,
        sink,
        Cursor("b", "c", cursor, needs_snapshot=needs_snapshot),
        open_req,
        drop,
        stop,
        trimmed,
        head,
    )


# case id, facts, the plan's step and the fields that matter (the others keep their defaults)
PLANS: list[tuple[str, ClientFacts, Step, dict[str, object]]] = [
    ("caught up: check the trim mark", facts(), Step.CHECK, {"sink_position": 10}),
    (
        "behind the cursor: lower it, then check",
        facts(at_sink(5), cursor=10),
        Step.CHECK,
        {"sink_position": 5, "lower_cursor_to": 5},
    ),
    ("checked: resume", facts(marks=(10, 30)), Step.LOG, {"sink_position": 10, "resume_after": 10}),
    (
        "checked: behind the cursor, resume (replay)",
        facts(at_sink(5), cursor=10, marks=(5, 30)),
        Step.LOG,
        {"sink_position": 5, "resume_after": 5, "lower_cursor_to": 5},
    ),
    (
        "checked: ahead of the cursor, raise it",
        facts(at_sink(25), cursor=20, marks=(20, 30)),
        Step.LOG,
        {"sink_position": 25, "resume_after": 25, "raise_cursor": True},
    ),
    (
        "checked: a loss with a provider records a drop",
        facts(at_sink(5), cursor=5, marks=(6, 30)),
        Step.SNAPSHOT,
        {
            "sink_position": 5,
            "record_drop": decide(5, 5, 6, 30, True),
            "reason": decide(5, 5, 6, 30, True).reason,
            "notify": True,
        },
    ),
    (
        "checked: behind the cursor and the trim point, a drop after lowering the cursor",
        facts(at_sink(5), cursor=10, marks=(6, 30)),
        Step.SNAPSHOT,
        {
            "sink_position": 5,
            "lower_cursor_to": 5,
            "record_drop": decide(5, 5, 6, 30, True),
            "reason": decide(5, 5, 6, 30, True).reason,
            "notify": True,
        },
    ),
    (
        "checked: behind the cursor and the trim point, no provider: stops, cursor lowered",
        facts(at_sink(5), cursor=10, provider=False, marks=(6, 30)),
        Step.STOP,
        {
            "sink_position": 5,
            "lower_cursor_to": 5,
            "resume_after": 5,
            "reason": decide(5, 10, 6, 30, False).reason,
        },
    ),
    (
        "the trim mark without the head: check",
        replace(facts(), trimmed_through=10),
        Step.CHECK,
        {"sink_position": 10},
    ),
    (
        "the head without the trim mark: check",
        replace(facts(), head=30),
        Step.CHECK,
        {"sink_position": 10},
    ),
    (
        "checked: a loss without a provider stops",
        facts(at_sink(5), cursor=5, provider=False, marks=(6, 30)),
        Step.STOP,
        {"sink_position": 5, "resume_after": 5, "reason": decide(5, 5, 6, 30, False).reason},
    ),
    (
        "checked: past the head, no provider, stops at the head",
        facts(at_sink(40), cursor=20, provider=False, marks=(0, 30)),
        Step.STOP,
        {"sink_position": 40, "resume_after": 20, "reason": decide(40, 20, 0, 30, False).reason},
    ),
    (
        "first contact with a provider: full sync",
        facts(at_sink(0), cursor=0),
        Step.SNAPSHOT,
        {"reason": "first contact", "notify": True},
    ),
    (
        "first contact without a provider: check",
        facts(at_sink(0), cursor=0, provider=False),
        Step.CHECK,
        {},
    ),
    (
        "first contact without a provider, checked: from the start",
        facts(at_sink(0), cursor=0, provider=False, marks=(0, 30)),
        Step.LOG,
        {},
    ),
    (
        "dropped: full sync, notice first",
        facts(drop=DROP),
        Step.SNAPSHOT,
        {"sink_position": 10, "reason": "dropped for falling behind", "notify": True, "drop": DROP},
    ),
    (
        "flagged for a snapshot: full sync",
        facts(needs_snapshot=True),
        Step.SNAPSHOT,
        {"sink_position": 10, "reason": "dropped for falling behind", "notify": True},
    ),
    (
        "dropped, no provider: stop before the hole",
        facts(drop=DROP, provider=False),
        Step.STOP,
        {
            "sink_position": 10,
            "resume_after": 7,
            "reason": "needs a full sync (dropped for falling behind)",
            "drop": DROP,
        },
    ),
    (
        "dropped, no provider, sink before the hole: stop at the sink",
        facts(at_sink(3), cursor=3, drop=DROP, provider=False),
        Step.STOP,
        {
            "sink_position": 3,
            "resume_after": 3,
            "reason": "needs a full sync (dropped for falling behind)",
            "drop": DROP,
        },
    ),
    (
        "open request, sink in log entry sync: continue it",
        facts(open_req=OPEN),
        Step.SNAPSHOT,
        {"sink_position": 10, "snapshot": OPEN, "notify": True},
    ),
    (
        "open request, no provider: refused, then check",
        facts(open_req=OPEN, provider=False),
        Step.CHECK,
        {"sink_position": 10, "refuse": OPEN},
    ),
    (
        "sink ongoing with the READY snapshot: resume its transfer",
        facts(at_sink(10, ONGOING, "s1", 7), open_req=OPEN),
        Step.SNAPSHOT,
        {"sink_position": 10, "snapshot": OPEN, "snapshot_after": 7},
    ),
    (
        "sink ongoing with the READY snapshot at ordinal 0: notice first",
        facts(at_sink(10, ONGOING, "s1", 0), open_req=OPEN),
        Step.SNAPSHOT,
        {"sink_position": 10, "snapshot": OPEN, "notify": True},
    ),
    (
        "sink ongoing with the snapshot not READY: start it over",
        facts(at_sink(10, ONGOING, "s1", 7), open_req=RUNNING),
        Step.SNAPSHOT,
        {"sink_position": 10, "snapshot": RUNNING, "notify": True},
    ),
    (
        "sink ongoing with another snapshot: ship the open one",
        facts(at_sink(10, ONGOING, "s1", 7), open_req=OTHER),
        Step.SNAPSHOT,
        {"sink_position": 10, "snapshot": OTHER, "notify": True},
    ),
    (
        "sink ongoing, nothing open: interrupted",
        facts(at_sink(10, ONGOING, "s9", 7)),
        Step.SNAPSHOT,
        {"sink_position": 10, "reason": "interrupted snapshot", "notify": True},
    ),
    (
        "sink ongoing, nothing open, no provider: stop",
        facts(at_sink(10, ONGOING, "s9", 7), provider=False),
        Step.STOP,
        {
            "sink_position": 10,
            "resume_after": 10,
            "reason": "needs a full sync (interrupted snapshot)",
        },
    ),
    (
        "sink completed the READY snapshot, its ack lost: finish, then check",
        facts(at_sink(40, COMPLETED, "s1"), cursor=3, open_req=OPEN, drop=DROP),
        Step.CHECK,
        {"sink_position": 40, "finish": OPEN},
    ),
    (
        "finished, checked: resume at the sink, the cursor is there",
        facts(at_sink(40, COMPLETED, "s1"), cursor=3, open_req=OPEN, drop=DROP, marks=(3, 50)),
        Step.LOG,
        {"sink_position": 40, "finish": OPEN, "resume_after": 40},
    ),
    (
        "sink completed a snapshot still RUNNING here: continue it",
        facts(at_sink(40, COMPLETED, "s1"), open_req=RUNNING),
        Step.SNAPSHOT,
        {"sink_position": 40, "snapshot": RUNNING, "notify": True},
    ),
    (
        "sink completed another snapshot: continue the open one",
        facts(at_sink(40, COMPLETED, "s1"), open_req=OTHER),
        Step.SNAPSHOT,
        {"sink_position": 40, "snapshot": OTHER, "notify": True},
    ),
    (
        "stopped, then a provider configured: clear the stop, full sync",
        facts(drop=DROP, stop=STOPPED),
        Step.SNAPSHOT,
        {
            "sink_position": 10,
            "clear_stop": True,
            "reason": "dropped for falling behind",
            "notify": True,
            "drop": DROP,
        },
    ),
    (
        "stopped, provider configured, stop accepted meanwhile: clear it, check",
        facts(stop=ACCEPTED_STOP),
        Step.CHECK,
        {"sink_position": 10, "clear_stop": True},
    ),
    (
        "a loss accepted, not resumed yet: resume after it",
        facts(provider=False, stop=ACCEPTED_STOP),
        Step.RESUME_ACCEPTED,
        {"sink_position": 10, "stop": ACCEPTED_STOP},
    ),
    (
        "a loss accepted, open request refused first",
        facts(provider=False, stop=ACCEPTED_STOP, open_req=OPEN),
        Step.RESUME_ACCEPTED,
        {"sink_position": 10, "stop": ACCEPTED_STOP, "refuse": OPEN},
    ),
    (
        "stopped, the sink now holds what it needs: no longer stopped",
        facts(provider=False, stop=STOPPED, marks=(10, 30)),
        Step.LOG,
        {"sink_position": 10, "resume_after": 10, "unstop": True, "stop": STOPPED},
    ),
    (
        "stopped, the sink still lacks entries: stays stopped",
        facts(at_sink(5), cursor=5, provider=False, stop=STOPPED, marks=(30, 40)),
        Step.STOP,
        {"sink_position": 5, "resume_after": 5, "reason": decide(5, 5, 30, 40, False).reason},
    ),
    (
        "accepted loss on record, sink past the accepted point: resume",
        facts(at_sink(12), cursor=12, provider=False, stop=RESUMED_STOP, marks=(20, 40)),
        Step.LOG,
        {"sink_position": 12, "resume_after": 12, "stop": RESUMED_STOP},
    ),
    (
        "accepted loss on record, trimmed further since: stop again",
        facts(at_sink(12), cursor=12, provider=False, stop=RESUMED_STOP, marks=(25, 40)),
        Step.STOP,
        {"sink_position": 12, "resume_after": 12, "reason": decide(12, 12, 25, 40, False).reason},
    ),
]


@pytest.mark.parametrize(
    ("given", "step", "fields"), [c[1:] for c in PLANS], ids=[c[0] for c in PLANS]
)
def test_plan_client(given: ClientFacts, step: Step, fields: dict[str, object]) -> None:
    expected = replace(ClientPlan("c", step), **fields)
    assert plan_client(given) == expected


def test_every_step_has_a_case() -> None:
    assert {c[2] for c in PLANS} == set(Step)


def test_plan_keeps_the_clients_order() -> None:
    first = replace(facts(), name="z")
    second = replace(facts(at_sink(0), cursor=0), name="a")
    plans = plan([first, second])
    assert list(plans) == ["z", "a"]
    assert [p.step for p in plans.values()] == [Step.CHECK, Step.SNAPSHOT]
