"""Streams: where they stand (``lr status``), a stopped one resumed (``lr accept-loss``),
acknowledged entries deleted (``lr trim``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lr_server.admin.checks import check_stream
from lr_server.admin.errors import StateError
from lr_server.admin.records import TrimResult
from lr_server.ops.status import collect_status
from lr_server.ops.status_records import SiteStatus

if TYPE_CHECKING:
    from lr_client.records import StreamStop
    from lr_client.store import QueueStore
    from lr_server.config import SiteConfig


def status(config: SiteConfig, store: QueueStore) -> SiteStatus:
    """Where every stream of the site stands (``lr status``): lag, state, acks, in-flight,
    snapshots, drops, stops, sessions, sink streams and cascades."""
    return collect_status(config, store)


def accept_loss(config: SiteConfig, store: QueueStore, destination: str, client: str) -> StreamStop:
    """Resume a stopped stream, accepting that its sink misses some entries (``lr
    accept-loss``); the stop as recorded, with the position log entries resume after.

    Raises :class:`AdminInputError` if the site does not replicate ``client`` to
    ``destination``, :class:`StateError` if the stream is not stopped.
    """
    check_stream(config, destination, client)
    stop = store.retention.accept_stream_loss(destination, client)
    if stop is None:
        raise StateError(f"stream {destination}/{client} is not stopped")
    return stop


def trim(config: SiteConfig, store: QueueStore, batch: int | None = None) -> TrimResult:
    """Delete the send-queue entries every destination has acknowledged (``lr trim``),
    ``batch`` rows per transaction (default ``retention.trim_batch``).

    On PostgreSQL the current slot is closed first, so everything acknowledged goes
    (the store's ``rotation_period`` is restored after).
    """
    before, store.retention.rotation_period = store.retention.rotation_period, 0.0
    try:
        return TrimResult(store.retention.trim(batch or config.retention.trim_batch))
    finally:
        store.retention.rotation_period = before
