"""The :class:`~lr_client.store.contract.Sites` role: schema, registered sites, the engine."""

from __future__ import annotations

from collections.abc import Sequence

from lr_client.names import validate_name
from lr_client.store import lifecycle
from lr_client.store import schema as s
from lr_client.store.base import StoreBase
from lr_client.store.lifecycle import SchemaStatus


class SitesStore(StoreBase):
    """Schema and site registration (the site cache itself is on the base)."""

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade the schema (concurrency-safe; see :mod:`lifecycle`)."""
        return lifecycle.upgrade_schema(self.engine)

    def check_schema(self) -> None:
        lifecycle.require_current(self.engine)

    def schema_status(self) -> SchemaStatus:
        return lifecycle.schema_status(self.engine)

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        wanted = [validate_name(x, "site id") for x in site_ids]
        known = self.site_numbers(refresh=True)
        new = [x for x in dict.fromkeys(wanted) if x not in known]
        if new:
            with self.write() as conn:
                self._insert_ignore(conn, s.sites, [{"site_id": x} for x in new], ["site_id"])
        return self.site_numbers(refresh=True)

    def close(self) -> None:
        """Close the store's connections (the engine's pool); the store can reconnect."""
        self.engine.dispose()


__all__ = ["SitesStore"]
