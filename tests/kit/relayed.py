"""Log batches of a cascaded client as its root ships them to a node below it, and an
application that takes them."""

from __future__ import annotations

from collections.abc import Sequence

from lr_client._proto import replication_pb2 as pb
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage, Session


def from_root(position: int, client: str = "policy", origin: str = "s1") -> pb.ReplicationBatch:
    """A log batch of one entry at ``position``, following ``position - 1``."""
    return pb.ReplicationBatch(
        batch_id=position,
        source_id=origin,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        first_position=position,
        last_position=position,
        previous_position=position - 1,
        entries=[
            pb.RoutingTableEntryMsg(
                type=pb.LOG_ENTRY_SYNC, opaque_payload=b"x%d" % position, position=position
            )
        ],
    )


class TakesAll(RoutingQueueListener):
    """A node's application that applies whatever it is given."""

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True
