"""The records the admin API returns: what ``lr ... --json`` prints, one dataclass each.

``to_dict()`` is the JSON object the command prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lr_client.snapshot_status import SnapshotInfo
from lr_client.store.schema.lifecycle import SchemaState, SchemaStatus


@dataclass(frozen=True)
class MemberView:
    """One of the site's servers (``lr members``): its heartbeat's age in seconds as of
    the database's clock, and the units of work it owns."""

    member_id: str
    address: str
    weight: int
    alive: bool
    heartbeat_age: float
    joined_at: float
    units: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr members --json`` prints for it."""
        return asdict(self)


@dataclass(frozen=True)
class ProviderSwitch:
    """The outcome of ``lr provider switch``: recorded at ``epoch``; ``adopted`` if the
    new provider answered (``error`` says why not otherwise)."""

    client: str
    provider: str
    previous_provider: str
    epoch: int
    local_watermark: int
    adopted: bool
    global_watermark: int | None
    error: str | None
    applied_position: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr provider switch --json`` prints."""
        out = asdict(self)
        del out["applied_position"]
        return out


@dataclass(frozen=True)
class DatabaseCheck:
    """Where the site's database stands (``lr init-db --check``): the schema's ``state``
    (``current``, ``behind``, ``ahead``, ``empty``) and revisions, and the configured
    destinations not registered yet. ``database`` is the URL without its password."""

    database: str
    state: str
    current: str | None
    expected: str
    pending: list[str]
    unregistered_destinations: list[str]
    status: SchemaStatus = field(repr=False, compare=False)

    @property
    def ready(self) -> bool:
        """The schema is current and every destination registered: a server may start."""
        return self.status.state is SchemaState.CURRENT and not self.unregistered_destinations

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr init-db --check --json`` prints."""
        out = asdict(self)
        del out["status"]
        return out


@dataclass(frozen=True)
class TrimResult:
    """What ``lr trim`` deleted: send-queue entries every destination had acknowledged."""

    entries: int

    def to_dict(self) -> dict[str, Any]:
        """``{"entries": n}``."""
        return asdict(self)


__all__ = ["DatabaseCheck", "MemberView", "ProviderSwitch", "SnapshotInfo", "TrimResult"]
