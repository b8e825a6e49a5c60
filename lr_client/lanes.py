"""Lanes: how a source splits one stream over ``lanes`` gRPC streams.

An entry with a partition key goes on lane ``1 + hash(key) % lanes``, with
the stable hash of :class:`~lr_client.partitioners.HashPartitioner`; an
entry without a key goes on lane 1. Source and sink compute the same lane
for an entry, so the sink can tell, from its key alone, which lane's progress
says whether it holds the entry already. Lane 0 is a stream shipped whole.
"""

from __future__ import annotations

from lr_client.partitioners import HashPartitioner

_HASH = HashPartitioner()
#: The most lanes one stream may be shipped over.
MAX_LANES = 16


def lane_of(key: bytes | None, lanes: int) -> int:
    """The lane (1..``lanes``) of an entry with partition key ``key``."""
    if key is None:
        return 1
    return 1 + _HASH(key, lanes)


__all__ = ["MAX_LANES", "lane_of"]
