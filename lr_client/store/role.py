"""What a role of the store is: an object holding the core it works through."""

from __future__ import annotations

from lr_client.store.core import StoreCore


class Role:
    """A role of the store: an object holding the :class:`StoreCore` it works through."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core


__all__ = ["Role"]
