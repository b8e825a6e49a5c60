"""Watermarks of a cascaded client: what every node of the set still needs.

Pure functions over what a node knows (its own delivered origin position and
the rows of ``lrq_cascade_children``); no I/O. Positions are origin positions
(the root's send-queue positions). A node *needs* every entry above its
delivered position; an entry may be deleted at a node only when it is at or
below what every live node of the set has delivered, because any live node may
be switched to any other provider of the set.

* **local watermark** of a node = min(its own delivered position, the local
  watermark of every child that *counts*). A leaf's is its delivered position.
* **global watermark** (the root's) = min over the children that count; with
  none, the root's head (nobody below needs anything).
* **relay floor** of a branch = min(global watermark it was told, its own
  delivered position, the acknowledged position of every child that counts):
  entries of the relayed queue above it are kept.
* **trim bound** at the root = min(global watermark, the per-destination bound
  the send queue already applies): entries at or below it may go.

A child *counts* unless it is dropped (by retention, or refused after it
switched to another provider) **and** its last report is older than
``grace`` seconds. A child that never reported counts with watermark 0 (it
holds everything) until it reports or is dropped. The grace keeps a node that
switched providers in its old provider's minimum until its new provider's
reports, which include it, have travelled to the root: without it, the root
could for a moment compute a global watermark from the old branch (no longer
counting the node) and a stale report of the new one (not counting it yet).
A dead node's last report is old, so once dropped it leaves the minimum at
once: a dead leaf never pins the root.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Seconds a dropped child whose last report is recent still counts (see module doc).
DEFAULT_GRACE = 30.0


@dataclass(frozen=True)
class ChildReport:
    """One row of ``lrq_cascade_children``: a node below this one, as it reported itself."""

    child_id: str
    epoch: int = 0
    local_watermark: int = 0
    acked_position: int = 0
    reported_at: float | None = None  # None: never reported (seeded from the config)
    dropped: bool = False


def counts(child: ChildReport, now: float, grace: float = DEFAULT_GRACE) -> bool:
    """Whether ``child`` takes part in the minimums at ``now``."""
    if not child.dropped:
        return True
    return child.reported_at is not None and now - child.reported_at < grace


def _live(children: Iterable[ChildReport], now: float, grace: float) -> list[ChildReport]:
    return [c for c in children if counts(c, now, grace)]


def _child_watermark(child: ChildReport) -> int:
    return child.local_watermark if child.reported_at is not None else 0


def _child_acked(child: ChildReport) -> int:
    return child.acked_position if child.reported_at is not None else 0


def local_watermark(
    delivered: int, children: Iterable[ChildReport], now: float, grace: float = DEFAULT_GRACE
) -> int:
    """A branch's or leaf's local watermark: what it and the nodes below it have delivered."""
    return min([delivered, *(_child_watermark(c) for c in _live(children, now, grace))])


def global_watermark(
    head: int, children: Iterable[ChildReport], now: float, grace: float = DEFAULT_GRACE
) -> int:
    """The root's global watermark; ``head`` is the client's last origin position."""
    return min([head, *(_child_watermark(c) for c in _live(children, now, grace))])


def relay_floor(
    global_wm: int,
    delivered: int,
    children: Iterable[ChildReport],
    now: float,
    grace: float = DEFAULT_GRACE,
) -> int:
    """A branch's relay floor: entries of the relayed queue above it are kept."""
    live = _live(children, now, grace)
    return min(
        [
            global_wm,
            delivered,
            *(_child_acked(c) for c in live),
            *(_child_watermark(c) for c in live),
        ]
    )


def root_trim_bound(global_wm: int, destination_bound: int | None = None) -> int:
    """The highest origin position the root may trim for a cascaded client."""
    return global_wm if destination_bound is None else min(global_wm, destination_bound)


__all__ = [
    "DEFAULT_GRACE",
    "ChildReport",
    "counts",
    "global_watermark",
    "local_watermark",
    "relay_floor",
    "root_trim_bound",
]
