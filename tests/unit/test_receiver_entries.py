"""A batch's entries, checked in one pass: no type, an unknown one or destinations refused."""

from __future__ import annotations

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import ProtocolError
from lr_client.records import ReplicationType
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
