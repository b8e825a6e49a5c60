"""Checks of an action's arguments against the site's config, before anything is written."""

from __future__ import annotations

from lr_server.admin.errors import AdminInputError
from lr_server.config import CascadeRole, SiteConfig, SnapshotProvider


def check_stream(config: SiteConfig, destination: str, client: str) -> None:
    """Raise :class:`AdminInputError` (naming ``destination`` or ``client``) unless the
    site replicates ``client`` to ``destination``."""
    dest = next((d for d in config.destinations if d.id == destination), None)
    if dest is None:
        known = ", ".join(d.id for d in config.destinations) or "none"
        raise AdminInputError(
            f"{destination!r} is not a destination of site {config.id} (configured: {known})",
            "destination",
        )
    clients = config.clients_for(dest)
    if clients and client not in clients:
        raise AdminInputError(
            f"{client!r} is not replicated to {destination} (clients: {', '.join(clients)})",
            "client",
        )


def check_snapshot_request(config: SiteConfig, destination: str, client: str) -> None:
    """Raise :class:`AdminInputError` unless a full sync of ``client`` to ``destination``
    may be requested: the site replicates it there and the client's config names a
    snapshot provider (not ``snapshot = "none"``)."""
    check_stream(config, destination, client)
    found = config.client(client)
    if found is not None and found.snapshot == SnapshotProvider.NONE:
        raise AdminInputError(
            f'client {client!r} has no snapshot provider (snapshot = "none"), so nobody '
            f'could make a full sync for {destination}; set snapshot = "app" or "spark"'
        )


def check_switch(config: SiteConfig, client: str, to: str) -> str:
    """The set's current configured provider of this site, or :class:`AdminInputError`
    naming the argument: the client must be cascaded here, this site not its root,
    ``to`` a node of the set other than this site and not below it (no cycle), and in
    ``[[sources]]`` with an ``address``."""
    cascade = config.cascade(client)
    if cascade is None:
        raise AdminInputError(
            f"{client!r} is not a cascaded client of this site (no [cascade.{client}])", "client"
        )
    if config.id == cascade.root:
        raise AdminInputError(f"{config.id} is the root of {client}: it has no provider", "client")
    members = cascade.members()
    if to not in members:
        raise AdminInputError(
            f"{to!r} is not a node of the set of {client} (nodes: {', '.join(members)})", "to"
        )
    if to == config.id:
        raise AdminInputError(f"{to} cannot be its own provider", "to")
    at = to
    while at != cascade.root:
        at = cascade.nodes[at]
        if at == config.id:
            raise AdminInputError(
                f"{to} receives {client} through {config.id}: switching to it would make a cycle",
                "to",
            )
    if cascade.role_of(to) is CascadeRole.LEAF:
        raise AdminInputError(
            f"{to} is a leaf of {client}: it keeps no copy to provide from (name it in "
            f"cascade.{client}.branches)",
            "to",
        )
    source = config.source(to)
    if source is None or not source.address:
        raise AdminInputError(
            f"{to} must be in [[sources]] with its address (sources.address) to provide "
            f"{client} here",
            "to",
        )
    return cascade.provider_of(config.id)
