"""Bad input (I7) and bad peers (I6), property-based, on both backends.

* The sender API: generated names, destination lists, payload types and sizes;
  every call either succeeds as an oracle predicts or raises the predicted
  :class:`~lr_client.errors.InvalidInputError` subclass, and a failed call
  leaves the database as it was (even when the application's transaction
  goes on and commits).
* The gRPC boundary of a running sink (one per module and backend, checked
  after every test: it still answers, and what the test did not write is as
  it was): generated garbage bytes, generated invalid batches (positions,
  types, names, snapshot ids, claimed sources), oversized batches, replays,
  unknown clients and impersonation. Each gets an error status and the sink
  stores nothing from the offender; a burst of them while a well-behaved
  source replicates through the real sender (a sink of its own) leaves that
  source's traffic complete.
* Names that become queue names: invalid ones are rejected everywhere
  (config, sender API, wire); valid look-alikes make distinct queues.
* Security with real processes: no plaintext listener unless configured, TLS
  ports refuse plaintext, missing / wrong client credentials, and tokens never
  reach a log file.

Extends ``tests/integration/test_security.py`` and ``test_sender.py`` (which
hold the single-case versions) rather than repeating them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

from lr_client import (
    ConfigError,
    InvalidDestinationsError,
    InvalidInputError,
    InvalidNameError,
    InvalidPayloadError,
    LRMessageWithDestinations,
    PayloadTooLargeError,
    RoutingQueueClient,
    UnknownDestinationError,
)
from lr_client._proto import replication_pb2 as pb
from lr_client.names import NAME_RE, recv_queue_name
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.schema import tables as lrq
from lr_server.config import load_config, parse_config
from lr_server.server import SiteServer
from tests.conftest import PgSchema
from tests.kit.certs import Pki, make_pki
from tests.kit.procs import ROOT, LrServer, lr_env
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config
from tests.kit.traffic import SinkApp, SourceApp, read_applied, read_sent
from tests.kit.verifier import AppliedEntry, verify
from tests.kit.wait import scaled
from tests.reliability.harness import fuzz_examples, tune_config

FUZZ = settings(
    max_examples=fuzz_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- the sender API ------------------------------------------------------------------------
LIMIT = 256
REGISTERED = ["site-b", "site-c"]
app_meta = MetaData()
app_orders = Table(
    "fuzz_orders", app_meta, Column("id", Integer, primary_key=True), Column("note", String(40))
)

names = st.one_of(
    st.sampled_from(["site-b", "site-c", "site-a", "site-z", "a_b", "B", "", "-x", "x" * 64]),
    st.sampled_from(["site-b'; DROP TABLE lrq_send_log_entries; --", "site-b\x00", "site-b "]),
    st.text(alphabet="abz09-_ ';\x00", max_size=8),
    st.none(),
    st.integers(),
    st.binary(max_size=4),
)
destinations = st.one_of(
    st.lists(names, max_size=4),
    st.lists(names, max_size=3).map(tuple),
    names,
    st.sets(st.sampled_from(REGISTERED), max_size=2),
    st.dictionaries(st.sampled_from(REGISTERED), st.integers(), max_size=2),
)
payloads = st.one_of(
    st.binary(min_size=LIMIT - 3, max_size=LIMIT + 3),
    st.binary(max_size=16),
    st.binary(max_size=LIMIT + 3).map(bytearray),
    st.binary(max_size=LIMIT + 3).map(lambda b: memoryview(b)),
    st.text(max_size=8),
    st.integers(),
    st.none(),
    st.floats(allow_nan=False),
    st.lists(st.integers(0, 255), max_size=4),
)


def _valid_name(value: object) -> bool:
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def expected_errors(payload: object, dests: object) -> set[type[Exception]]:
    """The oracle: the errors a transmit may raise (empty: it must succeed)."""
    errors: set[type[Exception]] = set()
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        errors.add(InvalidPayloadError)
    elif len(bytes(payload)) > LIMIT:
        errors.add(PayloadTooLargeError)
    if isinstance(dests, (str, bytes)) or not isinstance(dests, (list, tuple)) or not dests:
        errors.add(InvalidDestinationsError)
    elif not all(_valid_name(d) for d in dests):
        errors.add(InvalidNameError)
    elif len(set(dests)) != len(dests) or "site-a" in dests:
        errors.add(InvalidDestinationsError)
    elif any(d not in REGISTERED for d in dests):
        errors.add(UnknownDestinationError)
    return errors


def fingerprint(store: SQLAlchemyQueueStore) -> dict[str, int]:
    """Row counts of every queue table and of the application's table."""
    out = {}
    with store.read() as conn:
        for table in [*lrq.metadata.sorted_tables, app_orders]:
            if table.info.get("only") not in (None, store.dialect):
                continue
            out[table.name] = int(
                conn.execute(select(func.count()).select_from(table)).scalar_one()
            )
    return out


@pytest.fixture
def api(store: SQLAlchemyQueueStore) -> RoutingQueueClient:
    app_meta.create_all(store.engine)
    client = RoutingQueueClient(store, "site-a", "policy", max_payload_bytes=LIMIT)
    client.register_destinations(REGISTERED)
    return client


@FUZZ
@given(payload=payloads, dests=destinations, batch=st.booleans(), rows=st.integers(0, 2))
def test_sender_api_bad_input_is_typed_and_changes_nothing(
    api: RoutingQueueClient, payload: object, dests: object, batch: bool, rows: int
) -> None:
    store = api.store
    before = fingerprint(store)
    want = expected_errors(payload, dests)
    good = LRMessageWithDestinations(b"ok", ["site-b"])
    with Session(store.engine) as session, session.begin():
        session.execute(insert(app_orders).values(note="app write"))
        try:
            if batch:  # valid messages around the fuzzed one: all or nothing
                messages = [good] * rows + [LRMessageWithDestinations(payload, dests)]  # type: ignore[arg-type]
                api.transmit_log_entry_messages(session, messages)
            else:
                api.transmit_log_entry_message(session, payload, dests)  # type: ignore[arg-type]
        except InvalidInputError as exc:
            assert type(exc) in want, (type(exc), want)
            # The application goes on and commits: the failed call left nothing behind.
            session.flush()
            failed = True
        else:
            assert not want, f"accepted, expected {want}"
            failed = False
    after = fingerprint(store)
    assert after["fuzz_orders"] == before["fuzz_orders"] + 1
    sent = 0 if failed else (rows + 1 if batch else 1)
    assert after["lrq_send_log_entries"] == before["lrq_send_log_entries"] + sent
    unchanged = {k for k in before if k not in ("fuzz_orders", "lrq_send_log_entries")}
    assert {k: after[k] for k in unchanged} == {k: before[k] for k in unchanged}


@FUZZ
@given(source=names, client=names)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the names alone: no database read
def test_sender_api_names_are_validated(
    api: RoutingQueueClient, source: object, client: object
) -> None:
    store = api.store
    before = fingerprint(store)
    try:
        RoutingQueueClient(store, source, client)  # type: ignore[arg-type]
    except InvalidNameError:
        assert not (_valid_name(source) and _valid_name(client))
    else:
        assert _valid_name(source) and _valid_name(client)
    assert fingerprint(store) == before


@pytest.mark.parametrize("session", [None, "session", 42])
def test_wrong_session_type_is_a_typed_error(api: RoutingQueueClient, session: object) -> None:
    """Regression (found by this suite, fixed in 5abbb99): it was the builtin TypeError."""
    before = fingerprint(api.store)
    try:
        with pytest.raises(InvalidInputError):
            api.transmit_log_entry_message(session, b"x", ["site-b"])  # type: ignore[arg-type]
    finally:
        assert fingerprint(api.store) == before


# -- the gRPC boundary of a running sink ---------------------------------------------------
REPLICATE = "/lr.v1.LogReplication/Replicate"
NEGOTIATE = "/lr.v1.LogReplication/Negotiate"
# a: the good source; f: the fuzzer (nothing of it may ever be stored); r: replays;
# u: an unknown client; c and b-c: look-alike names; g: generated client names.
SOURCES = ("a", "f", "r", "u", "c", "b-c", "g")


@dataclass
class RawClient:
    """A hand-made gRPC client: any bytes, any metadata."""

    channel: grpc.Channel
    metadata: list[tuple[str, str]]

    def push_raw(self, chunks: list[bytes]) -> tuple[list[pb.ReplicationAck], grpc.StatusCode, str]:
        call = self.channel.stream_stream(
            REPLICATE,
            request_serializer=lambda b: b,
            response_deserializer=pb.ReplicationAck.FromString,
        )(iter(chunks), metadata=self.metadata, timeout=scaled(20))
        acks: list[pb.ReplicationAck] = []
        try:
            acks.extend(call)
        except grpc.RpcError as exc:
            return acks, exc.code(), exc.details() or ""
        return acks, grpc.StatusCode.OK, ""

    def push(
        self, *batches: pb.ReplicationBatch
    ) -> tuple[list[pb.ReplicationAck], grpc.StatusCode, str]:
        return self.push_raw([b.SerializeToString() for b in batches])

    def negotiate(self, request: pb.NegotiateRequest) -> grpc.StatusCode:
        call = self.channel.unary_unary(
            NEGOTIATE,
            request_serializer=pb.NegotiateRequest.SerializeToString,
            response_deserializer=pb.NegotiateResponse.FromString,
        )
        try:
            call(request, metadata=self.metadata, timeout=scaled(20))
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


class Boundary:
    """Sink ``b`` (token auth) and raw clients; with ``traffic``, also serving the real
    sender of ``a`` (its source application writing, a sink application applying)."""

    def __init__(
        self, tmp_path: Path, make_url: Callable[[str], str], traffic: bool = False
    ) -> None:
        self.port = free_port()
        self.url_b = make_url("b")
        sink_cfg = write_config(
            tmp_path, SiteSpec("b", self.url_b, port=self.port, sources=list(SOURCES))
        )
        tune_config(
            sink_cfg, {"replication": {"max_message_bytes": 1 << 20, "batch_max_bytes": 1 << 19}}
        )
        self.sink = SiteServer(load_config(sink_cfg))
        self.sink.start()
        self.store = open_store(self.url_b)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        #: Sources a test using the shared sink stores entries of (see :func:`boundary`).
        self.writes: set[str] = set()
        self.source: SourceApp | None = None
        self.app: SinkApp | None = None
        self.sender: SiteServer | None = None
        if traffic:
            url_a = make_url("a")
            self.source = SourceApp(url_a, "a", ["b"], rate=30, max_batch=2)
            self.app = SinkApp(self.url_b).start()
            spec = SiteSpec("a", url_a, destinations=[("b", self.port)])
            self.sender = SiteServer(load_config(write_config(tmp_path, spec)))
            self.sender.start()
            self.source.start()

    def client(self, source: str = "f", token: str | None = None, **extra: str) -> RawClient:
        """A raw client speaking as ``source`` (``extra`` replaces or, if empty, drops headers)."""
        headers = {"x-lr-source": source, "authorization": f"Bearer {token or 'token-' + source}"}
        headers.update(extra)
        return RawClient(self.channel, [(k, v) for k, v in headers.items() if v])

    def stored_from(self, source: str) -> tuple[int, int, int]:
        """(progress rows, queues, received entries) of ``source`` at the sink."""
        queues = [q.queue_id for q in self.store.queues.list_queues() if q.source_id == source]
        with self.store.read() as conn:
            progress = conn.execute(
                select(func.count())
                .select_from(lrq.sink_progress)
                .where(lrq.sink_progress.c.source_id == source)
            ).scalar_one()
            entries = conn.execute(
                select(func.count())
                .select_from(lrq.recv_entries)
                .where(lrq.recv_entries.c.queue_id.in_(queues))
            ).scalar_one()
        return int(progress), len(queues), int(entries)

    def state(self) -> dict[str, tuple[int, int, int]]:
        """:meth:`stored_from` of every source (and of ``x``, which it does not accept)."""
        return {s: self.stored_from(s) for s in (*SOURCES, "x")}

    def sentinel(self) -> list[tuple[int, bytes]]:
        """(position, payload) of what ``a`` stored for ``policy`` (see :func:`shared_boundary`)."""
        queue = next(
            q
            for q in self.store.queues.list_queues()
            if (q.source_id, q.client_name) == ("a", "policy")
        )
        with self.store.read() as conn:
            entries = self.store.queues.read_queue(conn, queue.queue_id, 100)
        return [(e.source_position, bytes(e.payload)) for e in entries]

    def finish(self) -> None:
        """Stop the good source's traffic: all of it must arrive, exactly once, in order."""
        source, app = self.source, self.app
        assert source is not None and app is not None, "a Boundary with traffic"
        source.stop()
        sent = read_sent(source.engine, "a")

        def applied() -> list[AppliedEntry]:
            return [a for a in read_applied(app.engine, "b") if a.source == "a"]

        wait_for(lambda: verify(sent, applied()).lost == 0, 60, what="a's entries delivered")
        report = verify(sent, applied(), rolled_back=source.rolled_back)
        report.assert_clean()
        assert report.applied > 0

    def close(self) -> None:
        self.channel.close()
        if self.sender is not None:
            self.sender.stop()
        if self.source is not None:
            self.source.close()
        if self.app is not None:
            self.app.close()
        # After a request it could not decode, grpcio never reports its server stopped
        # (the call's state is not released), so the stop waits out its whole bound
        # (5 s + grace): a short grace keeps that short. The sink serves no session.
        self.sink.stop(grace=1.0)
        self.store.engine.dispose()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def shared_boundary(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Boundary]:
    """One sink per backend for the module's boundary tests (see :func:`boundary`).

    Source ``a`` (no test speaks as it here) stores three entries first: the
    sentinel every test must leave as it is.
    """
    tmp_path = tmp_path_factory.mktemp(f"boundary-{request.param}")
    schemas: list[PgSchema] = []

    def make_url(name: str) -> str:
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / (name + '.db')}"
        schemas.append(PgSchema())
        return schemas[-1].url

    b = Boundary(tmp_path, make_url)
    try:
        acks, code, details = b.client("a").push(log_batch([1, 2, 3]))
        assert code == grpc.StatusCode.OK and acks[-1].last_position == 3, (code, details)
        assert b.sentinel() == [(p, b"p%d" % p) for p in (1, 2, 3)]
        yield b
    finally:
        b.close()
        for schema in schemas:
            schema.drop()


@pytest.fixture
def boundary(shared_boundary: Boundary) -> Iterator[Boundary]:
    """The module's sink; after the test it must still answer, hold the sentinel as it
    was and nothing new from any source but those the test names in ``writes``."""
    b = shared_boundary
    b.writes = set()
    before = b.state()
    yield b
    assert b.client("f").negotiate(pb.NegotiateRequest(source_id="f", clients=["policy"])) == (
        grpc.StatusCode.OK
    ), "the sink stopped answering"
    b.store.check_schema()
    assert b.sentinel() == [(p, b"p%d" % p) for p in (1, 2, 3)]
    after = b.state()
    assert {s: n for s, n in after.items() if s not in b.writes} == {
        s: n for s, n in before.items() if s not in b.writes
    }


@pytest.fixture
def busy_boundary(tmp_path: Path, db_url_factory: Callable[[str], str]) -> Iterator[Boundary]:
    """:func:`boundary` while the real sender of ``a`` replicates to it."""
    b = Boundary(tmp_path, db_url_factory, traffic=True)
    try:
        yield b
    finally:
        b.close()


def log_batch(
    positions: list[int], previous: int = 0, client: str = "policy", **kw: object
) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=1,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        previous_position=previous,
        first_position=positions[0] if positions else 0,
        last_position=positions[-1] if positions else 0,
        entries=[
            pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, opaque_payload=b"p%d" % p, position=p)
            for p in positions
        ],
        **kw,  # type: ignore[arg-type]
    )


def _plausible(data: bytes) -> bool:
    """Whether garbage happens to decode into a batch the sink could accept."""
    try:
        batch = pb.ReplicationBatch.FromString(data)
    except Exception:
        return False
    # An empty log batch with a valid client name is harmless and acknowledged (nothing stored).
    return _valid_name(batch.client_name) and batch.kind in (1, 2)


@FUZZ
@given(chunks=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=3))
def test_garbage_bytes_get_an_error_status(boundary: Boundary, chunks: list[bytes]) -> None:
    assume(not any(_plausible(c) for c in chunks))
    acks, code, details = boundary.client().push_raw(chunks)
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), (code, details)
    assert acks == []
    assert boundary.stored_from("f") == (0, 0, 0)


def test_undecodable_bytes_get_internal(boundary: Boundary) -> None:
    """Documented: grpc's own deserializer answers INTERNAL before our code runs."""
    acks, code, details = boundary.client().push_raw([b"\xff\xff\xff"])
    print(f"undecodable request: {code.name}: {details}")
    assert code == grpc.StatusCode.INTERNAL and acks == []
    assert boundary.stored_from("f") == (0, 0, 0)


def _defective_batch(draw: st.DrawFn) -> tuple[str, pb.ReplicationBatch]:
    """One invalid batch of the fuzzer's stream (its sink position is 0)."""
    defect = draw(
        st.sampled_from(
            [
                "not increasing",
                "gap",
                "client name",
                "destinations",
                "entry type",
                "snapshot id",
                "claims another source",
                "kind",
            ]
        )
    )
    n = draw(st.integers(1, 5))
    start = draw(st.integers(1, 1000))
    positions = list(range(start, start + n))
    if defect == "not increasing":
        i = draw(st.integers(0, n - 1))
        positions.insert(i + 1, positions[i] - draw(st.integers(0, positions[i])))
        return defect, log_batch(positions)
    if defect == "gap":
        previous = draw(st.integers(1, 10**6))
        return defect, log_batch([previous + 1 + p for p in range(n)], previous=previous)
    if defect == "client name":
        name = draw(st.text(max_size=70).filter(lambda s: not _valid_name(s)))
        return defect, log_batch(positions, client=name)
    if defect == "destinations":
        batch = log_batch(positions)
        batch.entries[draw(st.integers(0, n - 1))].destinations.append(
            draw(st.sampled_from(["b", "x", ""]))
        )
        return defect, batch
    if defect == "entry type":
        batch = log_batch(positions)
        batch.entries[draw(st.integers(0, n - 1))].type = draw(st.sampled_from([0, 2, 3, 7, 99]))  # type: ignore[assignment]
        return defect, batch
    if defect == "snapshot id":
        sid = draw(
            st.one_of(
                st.just(""),
                st.text(min_size=1, max_size=80).filter(
                    lambda s: not (s.isalnum() and len(s) <= 64)
                ),
            )
        )
        entries = [
            pb.RoutingTableEntryMsg(type=pb.SNAPSHOT_SYNC, position=i + 1, snapshot_id=sid)
            for i in range(n)
        ]
        return defect, pb.ReplicationBatch(
            batch_id=1,
            client_name="policy",
            kind=pb.BATCH_SNAPSHOT,
            snapshot_id=sid,
            entries=entries,
        )
    if defect == "claims another source":
        return defect, log_batch(positions, source_id=draw(st.sampled_from(["a", "c", "x"])))
    batch = log_batch(positions)
    batch.kind = draw(st.sampled_from([0, 3, 77]))  # type: ignore[assignment]
    return defect, batch


defective_batches = st.composite(_defective_batch)


@FUZZ
@given(data=st.data())
def test_invalid_batches_get_invalid_argument_and_store_nothing(
    boundary: Boundary, data: st.DataObject
) -> None:
    defect, batch = data.draw(defective_batches())
    client = boundary.client()
    acks, code, details = client.push(batch)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (defect, code, details)
    assert details, defect  # a message that says what is wrong
    assert acks == []
    assert boundary.stored_from("f") == (0, 0, 0), defect


def test_a_burst_of_bad_batches_is_rejected(busy_boundary: Boundary) -> None:
    """Every kind of defect, again and again, while the real sender replicates: each is
    refused, and the good source's traffic all arrives, once each, in order."""
    boundary = busy_boundary
    client = boundary.client()
    bad = [
        log_batch([3, 2]),
        log_batch([5], previous=4),
        log_batch([1], client="Policy"),
        log_batch([1], client="a_b"),
        log_batch([1], client="x'; DROP TABLE lrq_recv_entries; --"),
        log_batch([1], source_id="a"),
    ]
    for _ in range(5):
        for batch in bad:
            assert client.push(batch)[1] == grpc.StatusCode.INVALID_ARGUMENT
        assert client.push_raw([b"\xff\xff\xff"])[1] == grpc.StatusCode.INTERNAL
    assert boundary.stored_from("f") == (0, 0, 0)
    boundary.finish()


def test_oversized_batches(boundary: Boundary) -> None:
    client = boundary.client()
    big = log_batch([1])
    big.entries[0].opaque_payload = b"x" * (1 << 20)  # over the sink's 1 MiB message limit
    acks, code, _ = client.push(big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and acks == []
    many = log_batch(list(range(1, 100_002)))  # over the receiver's 100,000 entries per batch
    for e in many.entries:
        e.opaque_payload = b""
    assert len(many.SerializeToString()) < 1 << 20
    acks, code, details = client.push(many)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds" in details
    assert boundary.stored_from("f") == (0, 0, 0)


def test_replayed_batches_are_acked_as_duplicates_and_applied_once(boundary: Boundary) -> None:
    boundary.writes = {"r"}
    client = boundary.client("r")
    first, second = log_batch([1, 2, 3]), log_batch([4, 5], previous=3)
    second.batch_id = 2
    acks, code, _ = client.push(first, second)
    assert code == grpc.StatusCode.OK
    assert [(a.batch_id, a.last_position, a.duplicate) for a in acks] == [
        (1, 3, False),
        (2, 5, False),
    ]
    # The same batches again, on the same stream and on a new one, in and out of order.
    for replay in ([first, second], [second, first], [first]):
        acks, code, _ = boundary.client("r").push(*replay)
        assert code == grpc.StatusCode.OK and all(a.duplicate for a in acks), acks
        assert {a.last_position for a in acks} == {5}
    # A batch overlapping the applied ones appends only what is new.
    overlap = log_batch([4, 5, 6], previous=3)
    acks, _, _ = client.push(overlap)
    assert [(a.last_position, a.duplicate) for a in acks] == [(6, False)]
    queue = next(q for q in boundary.store.queues.list_queues() if q.source_id == "r")
    with boundary.store.read() as conn:
        entries = boundary.store.queues.read_queue(conn, queue.queue_id, 100)
    assert [e.source_position for e in entries] == [1, 2, 3, 4, 5, 6]
    assert boundary.store.recv.sink_progress("r", "policy").last_position == 6


def test_unknown_client_is_accepted_into_its_own_queue(boundary: Boundary) -> None:
    """Documented behaviour: a sink accepts any valid client name from an accepted source.

    ``[[clients]]`` configures what a site *sends*; the receiver does not check
    client names against it. A client the sink application never subscribes
    to just accumulates in its own queue (visible in ``lr status``/``browse``).
    """
    boundary.writes = {"u"}
    acks, code, _ = boundary.client("u").push(log_batch([1, 2], client="never-configured"))
    assert code == grpc.StatusCode.OK and acks[0].last_position == 2
    names = {q.queue_name for q in boundary.store.queues.list_queues()}
    assert recv_queue_name("never-configured", "u") in names


@pytest.mark.parametrize(
    ("source", "token", "extra", "code"),
    [
        ("a", "token-f", {}, grpc.StatusCode.UNAUTHENTICATED),  # f's token, claiming a
        ("c", "token-a", {}, grpc.StatusCode.UNAUTHENTICATED),  # a's token, claiming c
        ("x", "token-f", {}, grpc.StatusCode.PERMISSION_DENIED),  # a source b does not accept
        ("f", "token-f", {"x-lr-source": ""}, grpc.StatusCode.UNAUTHENTICATED),  # no claim
        ("f", "token-f", {"authorization": ""}, grpc.StatusCode.UNAUTHENTICATED),  # no token
        ("f", "token-f", {"authorization": "Basic token-f"}, grpc.StatusCode.UNAUTHENTICATED),
        ("f", "token-f", {"authorization": "Bearer token-f "}, grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_impersonation_and_missing_credentials(
    boundary: Boundary, source: str, token: str, extra: dict[str, str], code: grpc.StatusCode
) -> None:
    before = {s: boundary.stored_from(s) for s in ("f", "c", "x")}
    client = boundary.client(source, token, **extra)
    assert client.push(log_batch([1]))[1] == code
    assert client.negotiate(pb.NegotiateRequest(source_id=source, clients=["policy"])) == code
    assert {s: boundary.stored_from(s) for s in before} == before
    assert boundary.stored_from("f") == (0, 0, 0)


def test_negotiation_claiming_another_source_is_rejected(boundary: Boundary) -> None:
    client = boundary.client()
    request = pb.NegotiateRequest(source_id="a", clients=["policy"])
    assert client.negotiate(request) == grpc.StatusCode.INVALID_ARGUMENT
    bad_client = pb.NegotiateRequest(source_id="f", clients=["x'; --"])
    assert client.negotiate(bad_client) == grpc.StatusCode.INVALID_ARGUMENT
    assert boundary.stored_from("f") == (0, 0, 0)


# -- names that become queue names -----------------------------------------------------------
def test_look_alike_names_make_distinct_queues_and_underscores_are_refused(
    boundary: Boundary,
) -> None:
    """``a-b`` + ``c`` and ``a`` + ``b-c`` are distinct; ``a_b`` never gets in anywhere."""
    boundary.writes = {"c", "b-c"}
    acks, code, _ = boundary.client("c").push(log_batch([1], client="a-b"))
    assert code == grpc.StatusCode.OK and acks[0].last_position == 1
    acks, code, _ = boundary.client("b-c").push(log_batch([1, 2], client="a"))
    assert code == grpc.StatusCode.OK and acks[0].last_position == 2
    queues = {q.queue_name: q for q in boundary.store.queues.list_queues()}
    one, two = recv_queue_name("a-b", "c"), recv_queue_name("a", "b-c")
    assert one != two and {one, two} <= set(queues)
    assert boundary.store.queues.queue_depth(queues[one].queue_id) == 1
    assert boundary.store.queues.queue_depth(queues[two].queue_id) == 2
    # Underscores: refused on the wire, by the sender API and by the config.
    assert (
        boundary.client("c").push(log_batch([2], client="a_b"))[1]
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    with pytest.raises(InvalidNameError):
        RoutingQueueClient(boundary.store, "a_b", "c")
    with pytest.raises(InvalidNameError):
        RoutingQueueClient(boundary.store, "a", "b_c")
    raw = {
        "site": {"id": "a", "database_url": "sqlite://"},
        "security": {"transport": "plaintext", "client_auth": "token", "token": "t"},
        "clients": [{"name": "b_c"}],
    }
    with pytest.raises(ConfigError, match=r"clients\[0\]\.name"):
        parse_config(raw)


@FUZZ
@given(client=st.text(max_size=70))
def test_client_names_on_the_wire_are_validated(boundary: Boundary, client: str) -> None:
    """Any text as a client name: a valid name gets a queue, anything else INVALID_ARGUMENT."""
    boundary.writes = {"g"}
    acks, code, _ = boundary.client("g").push(log_batch([10**6], client=client))
    if _valid_name(client):
        assert code == grpc.StatusCode.OK and acks[0].last_position == 10**6
        assert recv_queue_name(client, "g") in {
            q.queue_name for q in boundary.store.queues.list_queues()
        }
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert all(_valid_name(q.client_name) for q in boundary.store.queues.list_queues())
    # Every table is still there (no name ever became SQL).
    boundary.store.check_schema()


# -- security with real processes -----------------------------------------------------------
def _lr(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lr_server.cli", *args],
        capture_output=True,
        text=True,
        env=lr_env(),
        cwd=ROOT,
        timeout=scaled(timeout),
    )


def test_no_plaintext_listener_unless_configured(tmp_path: Path) -> None:
    cfg = tmp_path / "implicit.toml"
    cfg.write_text(
        '[site]\nid = "b"\ndatabase_url = "sqlite:///b.db"\n'
        f'listen = "127.0.0.1:{free_port()}"\n'
        '[security]\nclient_auth = "token"\n'
        '[[sources]]\nid = "a"\ntoken = "t"\n'
    )
    done = _lr("server", "--config", str(cfg))
    assert done.returncode == 2, done
    assert "security.ca_file" in done.stderr + done.stdout
    assert not (tmp_path / "b.db").exists()  # refused before touching anything


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", client_names=("a", "b"))


def test_tls_port_refuses_plaintext_and_clients_without_valid_certificates(
    tmp_path: Path, pki: Pki
) -> None:
    port = free_port()
    spec = SiteSpec("b", f"sqlite:///{tmp_path / 'b.db'}", port=port, sources=["a"])
    server = LrServer(write_config(tmp_path, spec, security="mtls", pki=pki)).start()
    store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        server.wait_listening(port)
        request = pb.NegotiateRequest(source_id="a", clients=["policy"])
        meta = [("x-lr-source", "a")]

        def call(channel: grpc.Channel) -> grpc.StatusCode:
            try:
                channel.unary_unary(
                    NEGOTIATE,
                    request_serializer=pb.NegotiateRequest.SerializeToString,
                    response_deserializer=pb.NegotiateResponse.FromString,
                )(request, metadata=meta, timeout=scaled(10))
            except grpc.RpcError as exc:
                return exc.code()
            finally:
                channel.close()
            return grpc.StatusCode.OK

        target = f"127.0.0.1:{port}"
        opts = [("grpc.ssl_target_name_override", "b")]  # the sink's certificate names b
        ca, client = pki.ca.cert_pem(), pki.client("a")

        def tls(root: bytes, key: bytes | None, cert: bytes | None) -> grpc.Channel:
            creds = grpc.ssl_channel_credentials(root, key, cert)
            return grpc.secure_channel(target, creds, options=opts)

        results = {
            "plaintext": call(grpc.insecure_channel(target)),
            "no client certificate": call(tls(ca, None, None)),
            "client certificate of another CA": call(
                tls(ca, pki.wrong_client.key_pem(), pki.wrong_client.cert_pem())
            ),
            "expired client certificate": call(
                tls(ca, pki.expired_client.key_pem(), pki.expired_client.cert_pem())
            ),
            "server not trusted": call(
                tls(pki.wrong_ca.cert_pem(), client.key_pem(), client.cert_pem())
            ),
            "certificate of b claiming a": call(
                tls(ca, pki.client("b").key_pem(), pki.client("b").cert_pem())
            ),
            "valid": call(tls(ca, client.key_pem(), client.cert_pem())),
        }
        print(results)
        assert results.pop("valid") == grpc.StatusCode.OK
        assert results.pop("certificate of b claiming a") == grpc.StatusCode.PERMISSION_DENIED
        assert all(code == grpc.StatusCode.UNAVAILABLE for code in results.values()), results
        assert store.recv.list_sink_progress() == []
    finally:
        store.engine.dispose()
        assert server.stop() == 0, server.log()


def test_token_mode_over_tls(tmp_path: Path, pki: Pki) -> None:
    """``client_auth = "token"`` with ``transport = "tls"``: TLS only, then the token decides."""
    port = free_port()
    server_cert = pki.client("b")  # the sink presents b's certificate (names b)
    cfg = tmp_path / "b.toml"
    cfg.write_text(
        f'[site]\nid = "b"\ndatabase_url = "sqlite:///{tmp_path / "b.db"}"\n'
        f'listen = "127.0.0.1:{port}"\n'
        '[security]\ntransport = "tls"\nclient_auth = "token"\n'
        f'ca_file = "{pki.ca.cert}"\ncert_file = "{server_cert.cert}"\n'
        f'key_file = "{server_cert.key}"\n'
        '[[sources]]\nid = "a"\ntoken = "token-of-a"\n'
    )
    server = SiteServer(load_config(cfg))
    server.start()
    target = f"127.0.0.1:{port}"
    creds = grpc.ssl_channel_credentials(pki.ca.cert_pem())
    tls = grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "b")])
    plain = grpc.insecure_channel(target)
    request = pb.NegotiateRequest(source_id="a", clients=["policy"])

    def negotiate(channel: grpc.Channel, token: str) -> grpc.StatusCode:
        headers = [("x-lr-source", "a"), ("authorization", f"Bearer {token}")]
        return RawClient(channel, [(k, v) for k, v in headers if v]).negotiate(request)

    try:
        assert negotiate(plain, "token-of-a") == grpc.StatusCode.UNAVAILABLE  # no plaintext
        assert negotiate(tls, "wrong") == grpc.StatusCode.UNAUTHENTICATED
        assert negotiate(tls, "") == grpc.StatusCode.UNAUTHENTICATED
        assert negotiate(tls, "token-of-a") == grpc.StatusCode.OK
        # Tokens do not expire (rotate them by editing both configs); a valid one over
        # TLS replicates:
        acks, code, _ = RawClient(
            tls, [("x-lr-source", "a"), ("authorization", "Bearer token-of-a")]
        ).push(log_batch([1, 2]))
        assert code == grpc.StatusCode.OK and acks[0].last_position == 2
    finally:
        tls.close()
        plain.close()
        server.stop()


def test_tokens_never_reach_the_logs(tmp_path: Path) -> None:
    """A sink and a sender with a wrong token, plus hand-made bad attempts: no token logged."""
    port = free_port()
    secret_a, wrong = "s3cret-token-of-a-7f3a91", "wr0ng-token-used-by-a-c41d"
    secret_c = "s3cret-token-of-c-88e2b0"
    tokens = {"a": secret_a, "c": secret_c}
    sink_spec = SiteSpec("b", f"sqlite:///{tmp_path / 'b.db'}", port=port, sources=["a", "c"])
    sink = LrServer(write_config(tmp_path, sink_spec, tokens=tokens)).start()
    src_spec = SiteSpec("a", f"sqlite:///{tmp_path / 'a.db'}", destinations=[("b", port)])
    sender = LrServer(write_config(tmp_path, src_spec, tokens={"a": wrong})).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        sink.wait_listening(port)
        attempts = [
            ("a", wrong),  # wrong token
            ("c", secret_a),  # a's token claiming c
            ("a", secret_c),  # c's token claiming a
            ("zz", secret_a),  # a source b does not accept
        ]
        for source, token in attempts:
            client = RawClient(
                channel, [("x-lr-source", source), ("authorization", f"Bearer {token}")]
            )
            assert client.push(log_batch([1]))[1] != grpc.StatusCode.OK
        # The sender keeps failing to authenticate (and says so in its log).
        wait_for(
            lambda: (
                "UNAUTHENTICATED" in sender.full_log() and sink.full_log().count("rejected") >= 5
            ),
            60,
            what="the sender's and the sink's log entries of the rejections",
        )
    finally:
        channel.close()
        assert sender.stop() == 0
        assert sink.stop() == 0
    logs = sink.log_path.read_text() + sender.log_path.read_text()
    for secret in (secret_a, secret_c, wrong):
        assert secret not in logs
        assert secret[:12] not in logs  # nor a prefix of it
    assert re.search(r"invalid token|UNAUTHENTICATED", logs)
