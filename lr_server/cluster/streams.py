"""Which (destination, client) streams a site ships: those its configuration names, the
nodes of its cascade sets, and those the send queue holds entries of that no session ships."""

from __future__ import annotations

from lr_client.store import Shipping
from lr_server.config import SiteConfig


def configured_streams(config: SiteConfig) -> set[tuple[str, str]]:
    """The (destination, client) streams the config's sessions ship."""
    return {(d.id, c) for d in config.destinations for c in config.clients_for(d)}


def unconfigured_streams(
    config: SiteConfig, store: Shipping, after: int = 0
) -> tuple[list[tuple[str, str]], int]:
    """(destination, client) streams of the entries after ``after`` that no session ships.

    Sorted; with the highest position read, from which a caller that keeps
    what it found can go on next time.
    """
    pairs, top = store.log_streams(after)
    return sorted(pairs - shipped_streams(config)), top


def shipped_streams(config: SiteConfig) -> set[tuple[str, str]]:
    """The (destination, client) streams this site's entries reach: those its sessions
    ship, and each node of a cascade set, through the tree (an entry naming a node this
    site does not ship to directly is not left behind)."""
    in_sets = {(node, c.client) for c in config.cascades for node in c.members()}
    return configured_streams(config) | in_sets


__all__ = ["configured_streams", "shipped_streams", "unconfigured_streams"]
