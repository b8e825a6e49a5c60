"""The operator's API: every action of the ``lr`` command as a typed function.

Each function takes the site's :class:`~lr_server.config.SiteConfig` and/or its
store (:func:`lr_client.store.open_store` on ``config.database_url``) and
returns the record that the command's ``--json`` prints (``to_dict()``); the
``lr`` command is a thin layer over these functions. Failures are
:class:`AdminError` subclasses (:mod:`lr_server.admin.errors`); nothing is
changed when one is raised before the action's write.

::

    from lr_client.store import open_store
    from lr_server import load_config
    from lr_server import admin

    config = load_config("site.toml")
    store = open_store(config.database_url)
    try:
        for x in admin.status(config, store).send:
            print(x.destination, x.client, x.lag_entries)
        sid = admin.request_snapshot(config, store, "site-b", "policy")
    finally:
        store.close()
"""

from __future__ import annotations

from lr_server.admin.cascade import switch_provider
from lr_server.admin.checks import check_snapshot_request, check_stream, check_switch
from lr_server.admin.database import check_database, database_url, init_database
from lr_server.admin.errors import (
    AdminError,
    AdminInputError,
    FullSyncNeededError,
    NotFoundError,
    StateError,
)
from lr_server.admin.members import list_members, remove_member, set_member_weight
from lr_server.admin.parked import (
    BlockedView,
    ParkedCount,
    ParkedView,
    blocked_queues,
    discard_parked,
    list_parked,
    parked_counts,
    retry_parked,
    show_parked,
)
from lr_server.admin.records import (
    DatabaseCheck,
    MemberView,
    ProviderSwitch,
    SnapshotInfo,
    TrimResult,
)
from lr_server.admin.replays import list_replays, replay, rewind
from lr_server.admin.snapshots import (
    cancel_snapshot,
    list_snapshots,
    request_snapshot,
    snapshot_job_command,
)
from lr_server.admin.streams import accept_loss, status, trim
from lr_server.ops.browse import BrowsedEntry, QueueSummary, browse, list_queues
from lr_server.ops.status_records import SiteStatus

__all__ = [
    "AdminError",
    "AdminInputError",
    "BlockedView",
    "BrowsedEntry",
    "DatabaseCheck",
    "FullSyncNeededError",
    "MemberView",
    "NotFoundError",
    "ParkedCount",
    "ParkedView",
    "ProviderSwitch",
    "QueueSummary",
    "SiteStatus",
    "SnapshotInfo",
    "StateError",
    "TrimResult",
    "accept_loss",
    "blocked_queues",
    "browse",
    "cancel_snapshot",
    "check_database",
    "check_snapshot_request",
    "check_stream",
    "check_switch",
    "database_url",
    "discard_parked",
    "init_database",
    "list_members",
    "list_parked",
    "list_queues",
    "list_replays",
    "list_snapshots",
    "parked_counts",
    "remove_member",
    "replay",
    "request_snapshot",
    "retry_parked",
    "rewind",
    "set_member_weight",
    "show_parked",
    "snapshot_job_command",
    "status",
    "switch_provider",
    "trim",
]
