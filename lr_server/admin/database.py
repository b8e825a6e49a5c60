"""The site's database: its schema checked (``lr init-db --check``), created or upgraded
and its destinations registered (``lr init-db``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from lr_client.errors import ConfigError
from lr_client.store.schema.lifecycle import SchemaState, SchemaStatus
from lr_server.admin.records import DatabaseCheck

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_server.config import SiteConfig


def database_url(config: SiteConfig) -> URL:
    """``site.database_url`` parsed, or a :class:`~lr_client.errors.ConfigError` naming
    the key."""
    try:
        return make_url(config.database_url)
    except ArgumentError as exc:
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise ConfigError(f"site.database_url: {text}") from exc


def check_database(config: SiteConfig, store: QueueStore) -> DatabaseCheck:
    """Where the site's schema stands against this release and which configured
    destinations are not registered yet (``lr init-db --check``); changes nothing."""
    status = store.schema_status()
    dests = [d.id for d in config.destinations]
    if status.state is SchemaState.CURRENT:
        known = store.sites.site_numbers(refresh=True)
        dests = [d for d in dests if d not in known]
    return DatabaseCheck(
        database=database_url(config).render_as_string(hide_password=True),
        state=status.state.value,
        current=status.current,
        expected=status.expected,
        pending=list(status.pending),
        unregistered_destinations=dests,
        status=status,
    )


def init_database(config: SiteConfig, store: QueueStore) -> SchemaStatus:
    """Create or upgrade the site's schema (safe to run concurrently) and register its
    destinations (``lr init-db``); the schema's status before."""
    before = store.create_schema()
    store.sites.register_sites([d.id for d in config.destinations])
    return before
