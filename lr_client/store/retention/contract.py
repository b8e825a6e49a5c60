"""The retention role: what the send queue keeps, drop and stop records, flow control."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lr_client.records import (
    DropRecord,
    Fence,
    StreamStop,
)


class Retention(Protocol):
    """What the send queue keeps: trim, dropped and stopped streams, flow control."""

    #: PostgreSQL: seconds a send queue slot stays current before a trim closes it.
    rotation_period: float
    #: PostgreSQL: slots are added while the others are pinned, up to this many.
    max_slots: int

    def trim(
        self, batch_size: int = 5000, max_batches: int | None = None, fence: Fence | None = None
    ) -> int:
        """Delete entries every destination has acknowledged, and release the entries
        of ended snapshots still stored; return how many.

        With ``fence``, the trim runs only while its lease is held (else
        :class:`~lr_client.errors.FencedError` and nothing is deleted).

        SQLite deletes log entries as rows, at most ``batch_size`` per transaction
        and ``max_batches`` transactions. PostgreSQL retires every closed slot
        whose entries each destination has passed, whatever the batch bounds.

        A client this site is the root of a cascade of (``lrq_cascade``) is trimmed
        only at or below its stored global watermark
        (:meth:`CascadeReports.set_global_watermark`), whatever was acknowledged.
        """

    def drop_stream(
        self,
        destination: str,
        client_name: str,
        reason: str,
        first_dropped_position: int | None = None,
    ) -> DropRecord | None:
        """Release a destination's backlog (it will be re-synced by a full sync).

        The drop record's first dropped position is the cursor's successor
        unless ``first_dropped_position`` says otherwise.
        """

    def list_drops(self, destination: str | None = None) -> list[DropRecord]:
        """Current drop records (of one destination, if given)."""

    def clear_drop(self, destination: str, client_name: str) -> None:
        """Forget a drop record once the destination has been re-synced."""

    def trimmed_through(self, destination: str, client_name: str) -> int:
        """The highest position trim deleted among the stream's entries (0: none)."""

    def stop_stream(
        self, destination: str, client_name: str, reason: str, resume_after: int
    ) -> bool:
        """Record a stopped stream; False if it was already recorded."""

    def get_stream_stop(self, destination: str, client_name: str) -> StreamStop | None:
        """The stream's stop record, if it is stopped."""

    def list_stream_stops(self) -> list[StreamStop]:
        """Every stop record."""

    def accept_stream_loss(self, destination: str, client_name: str) -> StreamStop | None:
        """Mark a stopped stream's loss accepted (the session then resumes it)."""

    def mark_stream_resumed(self, destination: str, client_name: str) -> None:
        """The sink was told of an accepted loss; the stop record stays as a record."""

    def clear_stream_stop(self, destination: str, client_name: str) -> None:
        """Forget a stop record once the stream runs again."""

    def set_flow_state(self, client_name: str, backpressure: bool, slow: Sequence[str]) -> None:
        """Record a client's backpressure and slow destinations (the transmit path reads it)."""


__all__ = ["Retention"]
