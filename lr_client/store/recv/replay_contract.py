"""The replay role's contract: the record of a request and what a store does with it.

Implemented by :mod:`lr_client.store.recv.replays`; see :mod:`lr_server.sending.replay` for how a
sender session carries a request out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lr_client.records import WireEntry

#: The statuses of a request; the first two are open.
PENDING, RUNNING, DONE, REFUSED = "pending", "running", "done", "refused"
OPEN = (PENDING, RUNNING)


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One ``lr replay`` request, as recorded at the source."""

    replay_id: int
    destination: str
    client_name: str
    from_position: int  # the first position shipped again (inclusive)
    through_position: int | None  # the last one (set when the session picks it up)
    shipped_through: int  # acknowledged by the destination so far
    status: str
    error: str
    requested_at: float
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class Rewind:
    """What a sink's rewind (``lr rewind``) did: the entries it made deliverable again,
    their first and last source positions; or why it did nothing (``refused``)."""

    entries: int = 0
    first_position: int = 0
    last_position: int = 0
    refused: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


class Replays(Protocol):
    """The store's role for replays (both ends)."""

    def request_replay(
        self, destination: str, client_name: str, from_position: int
    ) -> ReplayRequest:
        """Record a request to ship the stream's entries from ``from_position`` again."""

    def list_replays(
        self, destination: str | None = None, open_only: bool = False
    ) -> list[ReplayRequest]:
        """The requests (of ``destination``; ``open_only``: pending or running), oldest first."""

    def update_replay(self, replay_id: int, **values: Any) -> None:
        """Change a request's ``status``, ``error``, ``through_position`` or
        ``shipped_through``."""

    def apply_replay_batch(
        self, source_id: str, client_name: str, entries: Sequence[WireEntry]
    ) -> tuple[bool, int]:
        """Queue a replayed batch again, flagged; (whether any was queued, its last position)."""

    def rewind_receive_queue(self, source_id: str, client_name: str, to_position: int) -> Rewind:
        """Lower the queue's delivered mark so that the delivered log entries it still
        holds from ``to_position`` on are delivered again, flagged replayed."""


__all__ = ["DONE", "OPEN", "PENDING", "REFUSED", "RUNNING", "ReplayRequest", "Replays", "Rewind"]
