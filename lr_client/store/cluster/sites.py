"""The :class:`~lr_client.store.contract.Sites` role: the sites registered, by number."""

from __future__ import annotations

from collections.abc import Sequence

from lr_client.names import validate_name
from lr_client.store.role import Role
from lr_client.store.schema import tables as s


class SitesStore(Role):
    """The sites this database knows, by number (the cache itself is on the core)."""

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        wanted = [validate_name(x, "site id") for x in site_ids]
        known = self.core.site_numbers(refresh=True)
        new = [x for x in dict.fromkeys(wanted) if x not in known]
        if new:
            with self.core.write() as conn:
                self.core.insert_ignore(conn, s.sites, [{"site_id": x} for x in new], ["site_id"])
        numbers = self.core.site_numbers(refresh=True)
        self.core.index_destinations(numbers.values())
        return numbers

    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        return self.core.site_numbers(refresh)

    def site_name(self, num: int) -> str:
        return self.core.site_name(num)


__all__ = ["SitesStore"]
