"""Where each unit of work runs: weighted rendezvous hashing over the live members.

A site's work is split into *units*: one per sender stream (destination,
client) and one for the trim job (snapshot launches and completions belong
to their stream's unit). Each unit goes to the live member with the highest
score ``-weight / ln(h)``, where ``h`` is a stable hash of (member, unit)
mapped into (0, 1) (blake2b: the same on every member and every run). A
member of weight 0 owns nothing; one of weight ``2w`` gets twice the units
of one of weight ``w`` on average. A member joining takes only the units it
now wins; one leaving gives up only its own (rendezvous hashing's minimal
movement).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

#: The trim job's unit (retention, trim, receive queue rotation, statistics).
TRIM_UNIT = "trim"


def stream_unit(destination: str, client_name: str) -> str:
    """The unit of one sender stream."""
    return f"stream/{destination}/{client_name}"


def parse_stream_unit(unit: str) -> tuple[str, str] | None:
    """(destination, client) of a stream unit; None for any other unit."""
    kind, _, rest = unit.partition("/")
    dest, _, client = rest.partition("/")
    if kind != "stream" or not dest or not client:
        return None
    return dest, client


def uniform(member_id: str, unit: str) -> float:
    """A stable hash of (member, unit) in the open interval (0, 1)."""
    digest = hashlib.blake2b(member_id.encode() + b"\x00" + unit.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def score(member_id: str, weight: float, unit: str) -> float:
    """The weighted rendezvous score of a member for a unit (higher wins; 0 weight: -inf)."""
    if weight <= 0:
        return -math.inf
    return -weight / math.log(uniform(member_id, unit))


def owner(unit: str, weights: Mapping[str, float]) -> str | None:
    """The member that should own ``unit`` (None: no member of positive weight)."""
    best: str | None = None
    best_score = -math.inf
    for member_id in sorted(weights):  # ties (never in practice) go the same way everywhere
        sc = score(member_id, weights[member_id], unit)
        if sc > best_score:
            best, best_score = member_id, sc
    return best


def place(units: Iterable[str], weights: Mapping[str, float]) -> dict[str, str | None]:
    """unit -> the member that should own it."""
    return {u: owner(u, weights) for u in units}


__all__ = ["TRIM_UNIT", "owner", "parse_stream_unit", "place", "score", "stream_unit", "uniform"]
