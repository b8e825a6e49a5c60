"""SnapshotInfo: a stored request as applications read it, rows shipped included."""

from __future__ import annotations

import pytest

from lr_client import InvalidInputError, SnapshotInfo, SnapshotStatus
from lr_client.records import SnapshotRequest
from lr_client.snapshot_status import parse_states


def _req(status: SnapshotStatus, shipped: int, total: int | None, written: int) -> SnapshotRequest:
    return SnapshotRequest("s1", "b", "policy", status, 7, "why", written, total, shipped, 1.0, 2.0)


@pytest.mark.parametrize(
    ("status", "shipped", "total", "written", "rows_shipped"),
    [
        (SnapshotStatus.REQUESTED, 0, None, 0, 0),
        (SnapshotStatus.RUNNING, 0, None, 40, 0),
        (SnapshotStatus.READY, 2, 3, 3, 2),  # rows 1 and 2 acknowledged
        (SnapshotStatus.READY, 4, 3, 3, 3),  # the end marker (ordinal 4) too: no more rows
        (SnapshotStatus.COMPLETED, 3, 3, 3, 3),
        (SnapshotStatus.COMPLETED, 0, None, 5, 5),  # a count not recorded: what was written
        (SnapshotStatus.CANCELLED, 1, 3, 3, 1),
    ],
)
def test_rows_shipped_counts_the_rows_the_sink_acknowledged(
    status: SnapshotStatus, shipped: int, total: int | None, written: int, rows_shipped: int
) -> None:
    info = SnapshotInfo.from_request(_req(status, shipped, total, written))
    assert info.rows_shipped == rows_shipped
    assert (info.snapshot_id, info.destination, info.client_name, info.state) == (
        "s1",
        "b",
        "policy",
        status,
    )
    assert (info.base_position, info.reason, info.rows_written, info.rows_total) == (
        7,
        "why",
        written,
        total,
    )
    assert (info.created_at, info.updated_at) == (1.0, 2.0)
    assert info.is_open == status.is_open


def test_states_are_parsed_from_names_or_members() -> None:
    assert parse_states(None) is None
    assert parse_states("ready") == [SnapshotStatus.READY]
    assert parse_states(["running", SnapshotStatus.FAILED]) == [
        SnapshotStatus.RUNNING,
        SnapshotStatus.FAILED,
    ]
    with pytest.raises(InvalidInputError, match="'requested', 'running'"):
        parse_states(["nope"])
