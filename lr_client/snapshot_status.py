"""Where full syncs stand, as applications read them: :class:`SnapshotInfo` records.

The same facts as ``lr snapshot list --json``, read from the source's store
(:meth:`RoutingQueueClient.snapshots <lr_client.RoutingQueueClient.snapshots>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from lr_client.errors import InvalidInputError
from lr_client.records import SnapshotRequest, SnapshotStatus


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One full-sync request of a client for one destination, and how far it got.

    ``state`` goes ``requested`` -> ``running`` (a provider writes rows) ->
    ``ready`` (all rows written; shipping) -> ``completed`` (the sink has every
    row), or ends ``cancelled`` (superseded) or ``failed`` (a new request
    follows). ``base_position`` is fixed when the provider starts: the
    snapshot holds the effect of every entry up to it, and log entries resume
    after it. ``rows_total`` is known once the provider finished;
    ``rows_shipped`` counts the rows the sink has stored and acknowledged.
    What the sink's listener has applied is known at the sink only.
    Timestamps are seconds since the epoch.
    """

    snapshot_id: str
    destination: str
    client_name: str
    state: SnapshotStatus
    base_position: int | None
    reason: str
    rows_written: int
    rows_total: int | None
    rows_shipped: int
    created_at: float
    updated_at: float

    @property
    def is_open(self) -> bool:
        """Whether it may still be shipped (requested, running or ready)."""
        return self.state.is_open

    def to_dict(self) -> dict[str, Any]:
        """Its fields as JSON values (``lr snapshot list --json``, ``lr status --json``)."""
        out = asdict(self)
        out["state"] = self.state.value
        return out

    @classmethod
    def from_request(cls, req: SnapshotRequest) -> SnapshotInfo:
        """The record of a stored request."""
        if req.status is SnapshotStatus.COMPLETED:
            shipped = req.entry_count if req.entry_count is not None else req.rows_written
        else:  # positions of shipped rows are their ordinals 1..n; the end marker is n + 1
            shipped = req.shipped_position
            if req.entry_count is not None:
                shipped = min(shipped, req.entry_count)
        return cls(
            snapshot_id=req.snapshot_id,
            destination=req.destination,
            client_name=req.client_name,
            state=req.status,
            base_position=req.base_position,
            reason=req.reason,
            rows_written=req.rows_written,
            rows_total=req.entry_count,
            rows_shipped=shipped,
            created_at=req.created_at,
            updated_at=req.updated_at,
        )


def parse_states(states: Iterable[SnapshotStatus | str] | None) -> list[SnapshotStatus] | None:
    """``states`` as :class:`SnapshotStatus` values (None: every state)."""
    if states is None:
        return None
    if isinstance(states, str):
        states = [states]
    out = []
    for x in states:
        try:
            out.append(SnapshotStatus(x))
        except ValueError:
            choices = ", ".join(repr(s.value) for s in SnapshotStatus)
            raise InvalidInputError(
                f"unknown snapshot state {x!r} (expected one of {choices})"
            ) from None
    return out


__all__ = ["SnapshotInfo", "parse_states"]
