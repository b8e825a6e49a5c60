"""What an in-process provider writes one snapshot through: :class:`SnapshotContext`.

Entries are written in chunks, each in its own short transaction, keyed by
``(snapshot_id, part, seq)``: re-writing a chunk replaces it, so a provider
that is retried never duplicates entries. The runner that calls providers is
:class:`~lr_client.snapshot.SnapshotProviderRunner`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from lr_client.errors import InvalidPayloadError, SnapshotError
from lr_client.records import SnapshotRequest, SnapshotStatus, check_partition_key, check_payload
from lr_client.store import SnapshotStore

#: Entries written per transaction by :meth:`SnapshotContext.transmit`.
DEFAULT_CHUNK_SIZE = 1000
#: Default payload limit of snapshot entries (as for log entries).
DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES = 64 * 1024 * 1024
#: Minimum seconds between two progress writes while a transmit is running.
PROGRESS_INTERVAL_S = 1.0


def _check_payload(payload: object, limit: int) -> bytes:
    return check_payload(payload, limit, "snapshot payload")


def _check_row(row: object, limit: int) -> tuple[bytes, bytes | None]:
    """A row to write: a payload, or a ``(payload, partition key)`` pair."""
    if isinstance(row, tuple):
        if len(row) != 2:
            raise InvalidPayloadError("a snapshot row is a payload or a (payload, key) pair")
        return _check_payload(row[0], limit), check_partition_key(row[1])
    return _check_payload(row, limit), None


def _chunks(items: Iterable[object], size: int) -> Iterator[list[object]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


class SnapshotContext:
    """What a provider callback gets: one RUNNING snapshot to fill.

    Use :meth:`transmit` to write entries, :meth:`is_cancelled` to stop early
    when the request was superseded, and :meth:`mark_completed` (or just
    return: the runner completes it) to write the end marker.
    """

    def __init__(
        self,
        store: SnapshotStore,
        request: SnapshotRequest,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_payload_bytes: int = DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES,
        seal: Callable[[bytes], bytes] | None = None,
    ) -> None:
        if request.status != SnapshotStatus.RUNNING:
            raise SnapshotError(
                f"snapshot {request.snapshot_id} is {request.status.value}, not running"
            )
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self.store = store
        self.request = request
        self.chunk_size = chunk_size
        self.max_payload_bytes = max_payload_bytes
        self.seal = seal  # encrypts each payload as it is written (None: written as given)
        self._next_seq = 0  # append position in part 0
        self._parts: dict[int, int] = {}  # explicit part -> entries written
        self._completed = False
        self._cancelled = False
        self._count: int | None = None
        self._progress_at = 0.0

    # -- the request ----------------------------------------------------------------
    @property
    def snapshot_id(self) -> str:
        """The id every entry of this snapshot is stamped with."""
        return self.request.snapshot_id

    @property
    def destination(self) -> str:
        """The site this snapshot is for."""
        return self.request.destination

    @property
    def client_name(self) -> str:
        """The application stream this snapshot is of."""
        return self.request.client_name

    @property
    def base_position(self) -> int:
        """Send-queue position the snapshot starts from.

        Log entries after it are shipped after the snapshot, so they may
        repeat changes already in it: apply must be idempotent per key.
        """
        return int(self.request.base_position or 0)

    @property
    def progress(self) -> int:
        """Entries written so far by this context."""
        return self._next_seq + sum(self._parts.values())

    @property
    def completed(self) -> bool:
        """Whether :meth:`mark_completed` has written the end marker."""
        return self._completed

    @property
    def entry_count(self) -> int | None:
        """The count in the end marker, once completed."""
        return self._count

    # -- writing ----------------------------------------------------------------------
    def transmit(
        self,
        payloads: Iterable[bytes | tuple[bytes, bytes | str | None]],
        *,
        part: int | None = None,
    ) -> int:
        """Write snapshot entries; return how many this call wrote.

        Each item is a payload, or a ``(payload, key)`` pair: the row's
        partition key, as for ``transmit_log_entry_message`` (a bad one raises
        :class:`~lr_client.errors.InvalidPartitionKeyError`).

        Without ``part``, entries are appended after those of earlier calls
        (part 0). With ``part=n`` (n >= 1) the call writes part ``n`` from its
        start, replacing entries a previous write of the same part left at the
        same places: a provider that splits its state into deterministic parts
        can retry a part safely.

        Entries are written in chunks of ``chunk_size``, each in its own
        transaction. A list or tuple is validated whole before anything is
        written; a lazy iterable is validated chunk by chunk, so on a bad
        payload the earlier chunks of the call stay written.

        Raises :class:`~lr_client.errors.InvalidPayloadError` (not bytes),
        :class:`~lr_client.errors.PayloadTooLargeError`, or
        :class:`~lr_client.errors.SnapshotError` once the snapshot is no longer
        running (cancelled, superseded, or already completed).
        """
        if self._completed:
            raise SnapshotError(f"snapshot {self.snapshot_id} is already completed")
        if part is not None and (isinstance(part, bool) or not isinstance(part, int) or part < 1):
            raise ValueError(f"part must be an int >= 1 (part 0 is the append part), got {part!r}")
        limit = self.max_payload_bytes
        if isinstance(payloads, (bytes, bytearray, memoryview, str)):
            raise InvalidPayloadError(
                "transmit takes an iterable of payloads, not a single " + type(payloads).__name__
            )
        source: Iterable[object] = payloads
        checked = isinstance(payloads, Sequence)
        if checked:
            source = [_check_row(p, limit) for p in payloads]
        seq = self._next_seq if part is None else 0
        target = 0 if part is None else part
        written = 0
        for chunk in _chunks(source, self.chunk_size):
            batch: list[tuple[bytes, bytes | None]] = (
                chunk  # type: ignore[assignment]  # validated whole above
                if checked
                else [_check_row(p, limit) for p in chunk]
            )
            self._write(target, batch, seq)
            seq += len(batch)
            written += len(batch)
            if part is None:
                self._next_seq = seq
            else:
                self._parts[part] = max(self._parts.get(part, 0), seq)
            if time.monotonic() - self._progress_at >= PROGRESS_INTERVAL_S:
                self._save_progress()
        return written

    def _write(self, part: int, rows: list[tuple[bytes, bytes | None]], first_seq: int) -> None:
        payloads = [self.seal(p) if self.seal else p for p, _ in rows]
        keys = [k for _, k in rows]
        try:
            with self.store.write() as conn:
                self.store.snapshot_entries.write_snapshot_entries(
                    conn,
                    self.snapshot_id,
                    part,
                    payloads,
                    first_seq,
                    keys if any(k is not None for k in keys) else None,
                )
        except SnapshotError:
            self._cancelled = True
            raise

    def _save_progress(self) -> None:
        self._progress_at = time.monotonic()
        self.store.snapshot_entries.set_snapshot_progress(self.snapshot_id, self.progress)

    def mark_completed(self) -> int:
        """Write the end marker (with the entry count); the snapshot becomes READY.

        Returns the entry count. Raises :class:`~lr_client.errors.SnapshotError`
        if the snapshot was cancelled or superseded meanwhile.
        """
        if self._completed:
            assert self._count is not None
            return self._count
        try:
            self._count = self.store.snapshot_entries.finish_snapshot(self.snapshot_id)
        except SnapshotError:
            self._cancelled = True
            raise
        self._completed = True
        return self._count

    def cancel(self, reason: str = "cancelled by the provider") -> None:
        """Give up this snapshot: cancel the request and release its entries."""
        self._cancelled = True
        self.store.snapshots.cancel_snapshot(self.snapshot_id, reason)

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled or superseded (asks the database).

        Call it between batches, not for every row.
        """
        if self._cancelled:
            return True
        req = self.store.snapshots.get_snapshot(self.snapshot_id)
        if req is None or req.status in (SnapshotStatus.CANCELLED, SnapshotStatus.FAILED):
            self._cancelled = True
        return self._cancelled


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES",
    "PROGRESS_INTERVAL_S",
    "SnapshotContext",
]
