"""A branch relays a batch as soon as its receiver stores it: the receiver rings the
sessions relaying the client (:mod:`lr_server.arrivals`), which do not wait for
their next poll. On both backends, with the in-process transport."""

from __future__ import annotations

import threading
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server.arrivals import Arrivals
from lr_server.config import ClientConfig, ReplicationConfig
from lr_server.receiver import Receiver
from lr_server.session import SenderSession
from lr_server.transport.inproc import InProcessTransport
from tests.kit.wait import join, scaled, wait_for

#: A session that waited for its poll would relay nothing while the test runs.
HOUR = 3600.0


def _from_root(position: int, client: str = "policy") -> pb.ReplicationBatch:
    """A log batch of one entry, as the root ``s1`` ships it to its child."""
    return pb.ReplicationBatch(
        batch_id=position,
        source_id="s1",
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


def test_the_receiver_tells_of_each_log_batch_it_stores(store: SQLAlchemyQueueStore) -> None:
    store.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    told: list[tuple[str, str]] = []
    receiver = Receiver(store, "s3", ["s1"], on_stored=lambda s, c: told.append((s, c)))
    receiver.apply("s1", _from_root(1))
    assert told == [("s1", "policy")]
    assert receiver.apply("s1", _from_root(1)).duplicate  # nothing stored: nothing told
    assert told == [("s1", "policy")]


def test_arrivals_ring_the_bells_of_the_client_until_forgotten() -> None:
    arrivals = Arrivals()
    policy, other = arrivals.bell(["policy"]), arrivals.bell(["other"])
    arrivals.ring("s1", "policy")
    assert policy.is_set() and not other.is_set()
    policy.clear()
    arrivals.forget(policy)
    arrivals.ring("s1", "policy")
    assert not policy.is_set()


def test_a_branch_relays_a_stored_batch_without_waiting_for_its_poll(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    branch = store
    node = branch.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    leaf = open_store(db_url_factory("s4"))
    leaf.create_schema()
    try:
        leaf.apply_cascade_config("policy", "s1", "leaf", "s3")
        arrivals = Arrivals()
        receiver = Receiver(branch, "s3", ["s1"], on_stored=arrivals.ring)
        receiver.apply("s1", _from_root(1))  # stored before the session starts
        at_leaf = Receiver(leaf, "s4", ["s3"])
        session = SenderSession(
            branch,
            "s3",
            "s4",
            [ClientConfig("policy")],
            lambda: InProcessTransport(at_leaf, "s3"),
            ReplicationConfig(poll_interval=HOUR),
            cascade={"policy": node},
            arrivals=arrivals,
        )
        stop = threading.Event()
        worker = threading.Thread(target=session.run, args=(stop,), daemon=True)
        worker.start()
        try:
            received = lambda: leaf.sink_progress("s1", "policy").last_position  # noqa: E731
            wait_for(lambda: received() == 1, timeout=scaled(30), what="the first entry")
            # Caught up with nothing in flight: the session waits. What is stored now
            # goes at once, not after the hour's poll.
            receiver.apply("s1", _from_root(2))
            wait_for(lambda: received() == 2, timeout=scaled(30), what="the entry stored later")
            assert [e.position for e in leaf.read_relay("policy", "s1", 0, 10)] == [1, 2]
        finally:
            stop.set()
            arrivals.ring("s1", "policy")  # end its wait now
            join(worker, 30)
    finally:
        leaf.engine.dispose()
