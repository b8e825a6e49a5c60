"""A batch's entries, checked in one pass: no type, an unknown one or destinations refused."""

from __future__ import annotations

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import ProtocolError
from lr_client.headers import encode_headers
from lr_client.records import ReplicationType, WireEntry
from lr_server.receiving.receiver import _entries


def _msg(kind: int, position: int = 1, **fields: object) -> pb.RoutingTableEntryMsg:
    return pb.RoutingTableEntryMsg(type=kind, position=position, **fields)  # type: ignore[arg-type]


def test_every_type_but_none_is_read() -> None:
    kinds = [t for t in ReplicationType if t is not ReplicationType.NONE]
    got = _entries([_msg(int(t), i) for i, t in enumerate(kinds, 1)], 0)
    assert [(e.type, e.position) for e in got] == [(t, i) for i, t in enumerate(kinds, 1)]


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (_msg(int(ReplicationType.NONE), 2), "entry without a type"),
        (_msg(99, 2), "unknown entry type 99"),
        (_msg(1, 2, destinations=["b"]), "entries must arrive with destinations stripped"),
    ],
)
def test_a_bad_entry_is_refused_with_its_reason(msg: pb.RoutingTableEntryMsg, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        _entries([_msg(1, 1), msg], 0)


def test_each_field_of_a_message_reaches_its_entry() -> None:
    full = _msg(
        int(ReplicationType.SNAPSHOT_SYNC),
        7,
        opaque_payload=b"row",
        snapshot_id="s1",
        snapshot_count=3,
        base_position=4,
        partition_key=b"k",
        origin_time=12.5,
        headers={"trace": "t1"},
    )
    bare = _msg(int(ReplicationType.LOG_ENTRY_SYNC), 8)
    first, second = _entries([full, bare], 6)
    assert first == WireEntry(
        7,
        ReplicationType.SNAPSHOT_SYNC,
        b"row",
        "s1",
        3,
        4,
        b"k",
        12.5,
        encode_headers({"trace": "t1"}),
    )
    assert second == WireEntry(8, ReplicationType.LOG_ENTRY_SYNC, b"")  # no key, no headers


def test_a_position_at_the_batchs_previous_one_is_refused() -> None:
    assert [e.position for e in _entries([_msg(1, 6)], 5)] == [6]
    with pytest.raises(ProtocolError, match=r"^batch positions must be strictly increasing$"):
        _entries([_msg(1, 5)], 5)
