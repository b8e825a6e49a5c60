"""Full syncs: requested, listed, cancelled (``lr snapshot``), and the Spark job's command."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lr_client.records import OPEN_SNAPSHOT_STATUSES
from lr_server.admin.checks import check_snapshot_request, check_stream
from lr_server.admin.errors import AdminInputError, NotFoundError, StateError
from lr_server.admin.records import SnapshotInfo

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_server.config import SiteConfig


def request_snapshot(
    config: SiteConfig,
    store: QueueStore,
    destination: str,
    client: str,
    reason: str = "operator request",
) -> str:
    """Ask for a full sync of ``client`` to ``destination`` (``lr snapshot request``);
    the snapshot id (the client's shared open snapshot, if the destination may join it).

    An open snapshot of the same destination and client is cancelled; the running
    server picks the request up. Raises :class:`AdminInputError` if the site does not
    replicate the client there or the client has no snapshot provider.
    """
    check_snapshot_request(config, destination, client)
    return store.snapshots.request_snapshot(None, destination, client, reason)


def list_snapshots(
    store: QueueStore,
    destination: str | None = None,
    client: str | None = None,
    *,
    only_open: bool = False,
    limit: int = 50,
) -> list[SnapshotInfo]:
    """Snapshot requests newest first, one per destination's view (``lr snapshot list``):
    of one destination, one client, only the open ones (requested, running, ready)."""
    if limit <= 0:
        raise AdminInputError("limit must be positive", "limit")
    wanted = OPEN_SNAPSHOT_STATUSES if only_open else None
    return [
        SnapshotInfo.from_request(x)
        for x in store.snapshots.list_snapshots(destination, client, wanted, limit)
    ]


def cancel_snapshot(
    store: QueueStore,
    snapshot_id: str,
    reason: str = "cancelled by operator",
    destination: str | None = None,
) -> SnapshotInfo:
    """Cancel an open snapshot, given its id or a unique prefix of it (``lr snapshot
    cancel``); with ``destination`` only for it (the others keep the shared snapshot).
    The snapshot's record after the cancel.

    Raises :class:`NotFoundError` if no snapshot (or several open ones) match the prefix,
    :class:`StateError` if it is not open.
    """
    # The id as given, else a prefix of an open one's: never every snapshot ever requested.
    exact = store.snapshots.get_snapshot(snapshot_id, destination)
    views = (
        [exact]
        if exact
        else store.snapshots.list_snapshots(destination, None, OPEN_SNAPSHOT_STATUSES)
    )
    matches = list({x.snapshot_id: x for x in views if x.snapshot_id.startswith(snapshot_id)})
    if not matches:
        raise NotFoundError(
            f"no snapshot {snapshot_id}" + (f" for {destination}" if destination else "")
        )
    if len(matches) > 1:
        raise NotFoundError(f"{snapshot_id} matches {len(matches)} snapshots; give more of the id")
    found = store.snapshots.get_snapshot(matches[0], destination)
    if found is None:
        raise NotFoundError(f"no snapshot {matches[0]}")
    if not store.snapshots.cancel_snapshot(found.snapshot_id, reason, destination):
        raise StateError(f"snapshot {found.snapshot_id} is {found.status.value}, not open")
    after = store.snapshots.get_snapshot(found.snapshot_id, destination)
    return SnapshotInfo.from_request(after if after is not None else found)


def snapshot_job_command(
    config: SiteConfig,
    destination: str,
    client: str,
    source: str | None = None,
    snapshot_id: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The PySpark snapshot job's command line for a client of ``config`` (``lr snapshot
    run``; see :func:`spark_jobs.launch.snapshot_job_command`). The database URL is not
    in it: the job reads ``$LR_DATABASE_URL``.

    Raises :class:`AdminInputError` if the stream is not replicated or no source is
    given and the client has no ``spark_source``.
    """
    from spark_jobs.launch import snapshot_job_command as job_command

    check_stream(config, destination, client)
    conf = config.client(client)
    spec = source or (conf.spark_source if conf else "")
    if not spec:
        raise AdminInputError(
            f"client {client!r} has no spark_source in the config; give one", "source"
        )
    return job_command(
        snapshot_id,
        source=spec,
        encoder=conf.spark_encoder if conf else "",
        key_column=conf.spark_key_column if conf else "",
        master=conf.spark_master if conf else None,
        spark_options=conf.spark_options if conf else None,
        destination=None if snapshot_id else destination,
        client=None if snapshot_id else client,
        extra_args=extra,
    )
