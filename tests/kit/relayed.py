"""Log batches of a cascaded client as its root ships them to a node below it, an
application that takes them, and what a test that calls a sender session's steps
directly gives it for a stream and a transport."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from lr_client._proto import replication_pb2 as pb
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_server.transport.base import BatchStream, Transport


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


class Sent(BatchStream):
    """Keeps what the session sends (and tells ``on_send`` of it); acknowledges nothing."""

    def __init__(self, on_send: Callable[[pb.ReplicationBatch], None] | None = None) -> None:
        self.batches: list[pb.ReplicationBatch] = []
        self.on_send = on_send

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.batches.append(batch)
        if self.on_send is not None:
            self.on_send(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        return None

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


def no_transport() -> Transport:
    """A session's transport in tests that call its steps directly: never opened."""
    raise AssertionError("these tests call the session's steps directly")
