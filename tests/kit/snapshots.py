"""Snapshot requests brought to a state, through the store's public methods."""

from __future__ import annotations

from lr_client.records import SnapshotRequest, SnapshotStatus
from lr_client.store.contract import QueueStore


def ready_snapshot(store: QueueStore, sid: str, rows: int = 2) -> SnapshotRequest:
    """Start ``sid``, write ``rows`` entries (``r0``, ``r1``, ...) and its end: READY."""
    assert store.snapshots.start_snapshot(sid) is not None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(
            conn, sid, 0, [b"r%d" % i for i in range(rows)]
        )
    store.snapshot_entries.finish_snapshot(sid)
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status is SnapshotStatus.READY
    return req
