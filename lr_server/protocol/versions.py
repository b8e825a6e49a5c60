"""The wire protocol's version: what this release speaks and the oldest peer it accepts.

Versions (``NegotiateRequest.protocol_version`` from the source,
``NegotiateResponse.protocol_version`` from the sink; a peer that sends none
is version 1):

1. The first release: log entry and snapshot batches.
2. Drop notices (``BATCH_DROP_NOTICE``, sent only to sinks that announce
   ``drop_notices``) and the version exchange itself.
3. Partition keys (``RoutingTableEntryMsg.partition_key``). A peer of version
   2 ignores the field (protobuf skips unknown fields): its sink queues the
   entries without keys, so they are delivered in total order, as before; a
   source of version 2 sends none.
4. Lanes (``ReplicationBatch.lane``, ``lanes``, ``low_water``): a source with
   ``streams_per_destination > 1`` ships a stream over several gRPC streams,
   and only to sinks of version 4 or newer (it refuses an older one with
   :class:`~lr_client.errors.IncompatibleVersionError`); with 1 it sends
   what version 3 sends.
5. Cascades (``NegotiateRequest.relays``, ``ClientState.origin_id``,
   ``RoutingTableEntryMsg.origin_time``, the ``Cascade`` call): a branch
   forwards a cascaded client's entries with their origin's identity (see
   docs/cascading.md). A peer of version 4 ignores the new fields; a branch
   relays only to sinks of version 5 or newer (:func:`require`
   refuses an older one), since an older sink would take relayed entries for
   the branch's own. Streams of clients that are not cascaded send what
   version 4 sends.
6. Headers (``RoutingTableEntryMsg.headers``, a ``map<string, string>``): a
   log entry's headers (lr_client.headers), the trace context among them
   (lr_client.tracing). Full sync rows and drop notices carry none.
   A sink of version 5 would drop the field unseen, so a source never sends
   an entry with headers to it: the session stops with
   :class:`~lr_client.errors.IncompatibleVersionError`, which names both
   versions, before the batch goes (:func:`require`), and retries
   until the sink is upgraded; nothing is lost or skipped. Entries without
   headers go to older sinks as before.
   Compression (``NegotiateRequest.codecs``, ``NegotiateResponse.codecs``,
   ``ReplicationBatch.codec`` and ``compressed``): a source offers the codec its
   destination is configured with, the sink answers those it accepts, and only
   then are batches compressed (:mod:`lr_server.protocol.codecs`). A sink of version 5
   answers none and gets batches uncompressed, as before.
   Replay (``ReplicationBatch.replay``): entries the sink already holds, sent
   again on an operator's request (``lr replay``); the sink queues them again,
   flagged replayed, and leaves its position as it is. Only sent to sinks of
   version 6 or newer (:func:`require`: the request is refused for an
   older one), and only accepted from sources that announced 6 or newer.

A release accepts peers from :data:`MIN_PEER_VERSION` on, so sites can be
upgraded one at a time; an older peer is refused at negotiation with
:class:`~lr_client.errors.IncompatibleVersionError` (gRPC
``FAILED_PRECONDITION``), which names both versions.
"""

from __future__ import annotations

from lr_client.errors import IncompatibleVersionError

#: The wire protocol this release speaks.
PROTOCOL_VERSION = 6
#: The first version whose sinks accept batches of lanes.
LANES_VERSION = 4
#: The first version whose sinks accept relayed (cascaded) clients.
CASCADE_VERSION = 5
#: The first version whose sinks accept entry headers.
HEADERS_VERSION = 6
#: The first version whose sinks accept compressed batches (when they answer the codec).
COMPRESSION_VERSION = 6
#: The first version whose sinks accept replayed batches.
REPLAY_VERSION = 6
#: The oldest peer version this release accepts.
MIN_PEER_VERSION = 1


def peer_version(announced: int) -> int:
    """The peer's version from the field it sent (0: a peer that predates the field)."""
    return announced or 1


def require_compatible(announced: int, peer: str) -> int:
    """The peer's version, or :class:`IncompatibleVersionError` if it is too old."""
    version = peer_version(announced)
    if version < MIN_PEER_VERSION:
        raise IncompatibleVersionError(
            f"{peer} speaks wire protocol {version}; this release needs {MIN_PEER_VERSION} "
            f"or newer (it speaks {PROTOCOL_VERSION}): upgrade {peer}"
        )
    return version


#: What each feature needs of a sink: (version, what needs it, the way out).
FEATURES: dict[str, tuple[int, str, str]] = {
    "lanes": (
        LANES_VERSION,
        "streams_per_destination > 1 needs",
        "upgrade it or set streams_per_destination = 1",
    ),
    "cascade": (CASCADE_VERSION, "relaying a cascaded client needs", "upgrade it"),
    "headers": (HEADERS_VERSION, "entries with headers need", "upgrade it"),
    "replay": (REPLAY_VERSION, "replay needs", "upgrade it"),
}


def require(feature: str, announced: int, peer: str) -> None:
    """:class:`IncompatibleVersionError` unless the sink ``peer`` (which announced
    ``announced``) speaks the version ``feature`` needs (:data:`FEATURES`)."""
    needed, what, fix = FEATURES[feature]
    version = peer_version(announced)
    if version < needed:
        raise IncompatibleVersionError(
            f"sink {peer} speaks wire protocol {version}; {what} {needed} or newer "
            f"(this source speaks {PROTOCOL_VERSION}): {fix}"
        )


__all__ = [
    "CASCADE_VERSION",
    "COMPRESSION_VERSION",
    "FEATURES",
    "HEADERS_VERSION",
    "LANES_VERSION",
    "MIN_PEER_VERSION",
    "PROTOCOL_VERSION",
    "REPLAY_VERSION",
    "peer_version",
    "require",
    "require_compatible",
]
