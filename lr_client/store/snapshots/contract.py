"""Part of the queue store contract, split by role: what each caller needs of the store.

Callers type against the role(s) they play (:class:`Shipping` for a sender session's
reads, :class:`Receiving` for a sink's receiver, :class:`Replays` for ``lr replay``, ...);
:class:`QueueStore` combines them all and is what :func:`~lr_client.store.open_store`
returns. Methods that take a ``conn`` run inside the caller's transaction (the
application's, or a subscriber's) and commit or roll back with it; the others run their
own short transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    DropRecord,
    Fence,
    SendEntry,
    SnapshotRequest,
    SnapshotStatus,
)


class SnapshotRequests(Protocol):
    """Snapshot requests: asked for, started by a provider, shipped, ended."""

    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        """Join the client's shared snapshot the destination may join, or ask for the next;
        return its id.

        The destination leaves its open one first (superseded; it goes on for
        the others). It joins the oldest open snapshot that is REQUESTED, or
        RUNNING or READY with a base position at or above the destination's
        cursor when it has a cursor and no drop record; else a new one is
        REQUESTED. With ``conn`` (the caller's transaction) the entries of a
        snapshot left with no destination are released by the next
        :meth:`Retention.trim`."""

    def get_snapshot(
        self, snapshot_id: str, destination: str | None = None
    ) -> SnapshotRequest | None:
        """A destination's view of a snapshot; without one, the snapshot's own."""

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
        limit: int | None = None,
    ) -> list[SnapshotRequest]:
        """Each destination's view of the snapshots it is in, newest first (``limit`` at most)."""

    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        """The open (requested, running or ready) request of each client that has one."""

    def send_checks(
        self, destination: str, client_names: Sequence[str]
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        """What a sender looks up after reading entries, before it sends them, on one
        connection: :meth:`open_snapshots` of ``client_names`` and the destination's
        drop records (:meth:`Retention.list_drops`) by client, each as committed when
        its statement began."""

    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        destination: str | None = None,
        **values: object,
    ) -> bool:
        """Update a snapshot if its status is in ``expect``; return whether it was updated.

        With ``destination``: that destination's view only (``status``,
        ``reason``, ``shipped_position``); a snapshot left with no open
        destination ends. Without: the snapshot, a new status going to its
        open destinations too."""

    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        """REQUESTED -> RUNNING, fixing ``base_position``; None if no longer requested."""

    def snapshot_base_applied(self, snapshot_id: str) -> bool:
        """Whether this node's own data covers the base of a started snapshot, so that its
        provider may read: at once where the node originates the client; at a branch once
        its subscriber has delivered the relayed entries through the base."""

    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        """Record that the worker of a RUNNING request is alive; False if it is not running."""

    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        """RUNNING -> FAILED if its worker was last heard of before ``silent_since``.

        ``silent_since`` is a wall-clock time (``time.time()``). Entries the
        worker wrote are released. Returns whether the request was failed.
        """

    def cancel_snapshot(
        self, snapshot_id: str, reason: str = "cancelled", destination: str | None = None
    ) -> bool:
        """Cancel an open snapshot and release its entries (also retries an ended one's).

        With ``destination``: cancel it for that destination only; the others
        keep it, and its entries are released once none is left.

        Entries in use by a reader that cannot be released at once are
        released by the next :meth:`Retention.trim`; the slot stays theirs till then.
        """

    def complete_snapshot(
        self, snapshot_id: str, destination: str | None = None, fence: Fence | None = None
    ) -> bool:
        """READY -> COMPLETED for ``destination`` (None: every one): its sink has it all.

        The entries are released when the last destination in the snapshot
        is done with it (completed it or left). With ``fence``, only while
        its lease is held (else :class:`~lr_client.errors.FencedError`).
        """


class SnapshotEntries(Protocol):
    """The snapshot queue: the entries a provider writes and the sessions read."""

    def write_snapshot_entries(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        payloads: Sequence[bytes],
        first_seq: int = 0,
        keys: Sequence[bytes | None] | None = None,
    ) -> int:
        """Write one part of a snapshot idempotently (re-writing a part replaces it);
        ``keys``: each payload's partition key (None: none)."""

    def write_snapshot_part(
        self,
        snapshot_id: str,
        part: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        chunk_rows: int,
        *,
        bulk: bool = True,
    ) -> int:
        """Write a whole part idempotently, ``chunk_rows`` entries per transaction.

        Entries past the part's end (an earlier attempt's) are deleted; ``bulk``
        lets a backend stream the rows in. Returns the part's entry count.
        """

    def drop_unwritten_parts(self, snapshot_id: str, written: Mapping[int, int]) -> None:
        """Delete the entries of every part not in ``written`` (part -> entry count)."""

    def snapshot_rows_committed(self, snapshot_id: str, parts: int) -> int:
        """Entries committed so far by parts ``0 .. parts - 1`` (for progress)."""

    def count_snapshot_entries(self, snapshot_id: str) -> int:
        """How many entries (end marker aside) a snapshot has written."""

    def set_snapshot_progress(self, snapshot_id: str, rows_written: int) -> None:
        """Record a RUNNING snapshot's progress (and that its worker is alive)."""

    def finish_snapshot(self, snapshot_id: str) -> int:
        """Write the end marker with the entry count and mark the snapshot READY."""

    def read_snapshot_entries(
        self, snapshot_id: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        """Entries of a READY snapshot after ``after`` (ordinal positions), end marker last."""


__all__ = ["SnapshotEntries", "SnapshotRequests"]
