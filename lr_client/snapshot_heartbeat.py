"""The heartbeat of a running snapshot's worker (the in-process provider runner's, the
PySpark job's): a worker that dies stops it, and the sender session replaces the
snapshot instead of waiting for it forever."""

from __future__ import annotations

import logging
import threading

from lr_client.store import SnapshotStore

log = logging.getLogger("lr_client.snapshot")

#: Seconds between two heartbeats of a running snapshot's worker. The sender
#: session fails a RUNNING snapshot not heard of for ``snapshot_stall_timeout``
#: (``[replication]``, 60 s by default) and asks for a new one.
HEARTBEAT_INTERVAL_S = 5.0


class SnapshotHeartbeat:
    """While the block runs, tell the sender that a RUNNING snapshot's worker is alive.

    A daemon thread refreshes the request every ``interval`` seconds, so a
    worker that crashes (its process killed) stops the heartbeat and the
    sender session replaces the snapshot instead of waiting for it forever::

        with SnapshotHeartbeat(store, snapshot_id):
            ...  # read the source, write the entries
    """

    def __init__(
        self, store: SnapshotStore, snapshot_id: str, interval: float = HEARTBEAT_INTERVAL_S
    ) -> None:
        self.store = store
        self.snapshot_id = snapshot_id
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"lr-snapshot-heartbeat-{snapshot_id[:8]}", daemon=True
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self.store.snapshots.heartbeat_snapshot(self.snapshot_id):
                    return  # completed, cancelled or failed: nothing to keep alive
            except Exception:  # a missed beat is retried; the timeout is many beats long
                log.warning("snapshot %s: heartbeat failed", self.snapshot_id, exc_info=True)

    def __enter__(self) -> SnapshotHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


__all__ = ["HEARTBEAT_INTERVAL_S", "SnapshotHeartbeat"]
