"""Steady, checkable application traffic for the reliability tests.

The *source application* (:class:`SourceApp`) changes a key-value table and,
in the same transaction, transmits each change and records it in
``rel_sent`` (payload id, client, position, destinations): the source's own
record of what was committed. A configurable fraction of its transactions
transmit and then roll back; their payload ids are kept in memory, and none
may ever be applied.

The *sink application* (:class:`RecordingListener`) applies each change to its
own key-value table and writes one ``rel_applied`` row per message (and per
full sync start / end), all with the session the subscriber gives it, so the
rows commit with the delivery. :mod:`tests.kit.verifier` compares the two.

Payloads are JSON: ``{"id": payload id, "k": key, "v": value, "pad": ...}``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.orm import Session

from lr_client import (
    EntryRef,
    LRMessageWithDestinations,
    RoutingQueueClient,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.snapshot import SnapshotContext
from lr_client.store import SQLAlchemyQueueStore, create_app_tables, create_engine, open_store
from lr_client.store.schema import tables as lrq
from tests.kit.verifier import END, LOG, SNAPSHOT, START, AppliedEntry, SentEntry, SnapshotInfo
from tests.kit.wait import scaled

log = logging.getLogger("tests.traffic")

_Id = BigInteger().with_variant(Integer(), "sqlite")

meta = MetaData()
rel_sent = Table(
    "rel_sent",
    meta,
    Column("payload_id", String(64), primary_key=True),
    Column("client", String(63), nullable=False),
    # Written in the transmitting transaction: the entry's ref (txid, ord), and
    # its position once known (PostgreSQL gives it after commit).
    Column("txid", BigInteger, nullable=False),
    Column("ord", BigInteger, nullable=False),
    Column("position", BigInteger, nullable=True),
    Column("dests", String(512), nullable=False),
)
rel_source_kv = Table(
    "rel_source_kv",
    meta,
    Column("client", String(63), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)
rel_applied = Table(
    "rel_applied",
    meta,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("source", String(63), nullable=False),
    Column("client", String(63), nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("payload_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("snapshot_id", String(64), nullable=False),
    Column("key", String(64), nullable=False),
    Column("value", BigInteger, nullable=False),
)
rel_sink_kv = Table(
    "rel_sink_kv",
    meta,
    Column("source", String(63), primary_key=True),
    Column("client", String(63), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)
SOURCE_TABLES = [rel_sent, rel_source_kv]
SINK_TABLES = [rel_applied, rel_sink_kv]


def encode(payload_id: str, key: str, value: int, pad: int = 0, noise: bool = False) -> bytes:
    """A payload; ``pad`` characters more, random (``noise``: they do not compress, as
    PostgreSQL compresses large values) or not."""
    body: dict[str, Any] = {"id": payload_id, "k": key, "v": value}
    if pad:
        body["pad"] = os.urandom(pad // 2 + 1).hex()[:pad] if noise else "x" * pad
    return json.dumps(body, separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(payload)
    return value


class _Rollback(Exception):
    """Raised inside an application transaction to roll it back after transmitting."""


# -- the source application ---------------------------------------------------------------
class SourceApp:
    """Writes key-value changes and transmits them, at a steady rate, from a thread.

    Each transaction changes 1..``max_batch`` keys of one client, transmits
    each change to a random non-empty subset of ``destinations`` and records
    it in ``rel_sent``. ``rollback_fraction`` of the transactions roll back
    after transmitting. Payload ids are ``<prefix>-<n>``: use a new prefix per
    trial when one database sees several. ``state=False`` skips the key-value
    table (less work per entry, for the soak). Several changes of a transaction
    use the batch transmit.
    """

    def __init__(
        self,
        url: str,
        source: str,
        destinations: Sequence[str],
        *,
        clients: Sequence[str] = ("policy",),
        seed: int = 0,
        prefix: str = "t0",
        rate: float = 100.0,
        max_batch: int = 4,
        rollback_fraction: float = 0.05,
        keys: int = 200,
        pad: int = 0,
        all_destinations: bool = False,
        state: bool = True,
        keyed: bool = False,
        noise: bool = False,
    ) -> None:
        self.engine = create_engine(url)
        meta.create_all(self.engine, tables=SOURCE_TABLES)
        self.store = open_store(self.engine)
        self.store.create_schema()
        self.source = source
        self.destinations = list(destinations)
        self.apis = {
            c: RoutingQueueClient(self.store, source, c, backpressure="ignore") for c in clients
        }
        for api in self.apis.values():
            api.register_destinations(self.destinations)
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.rate = rate
        self.max_batch = max_batch
        self.rollback_fraction = rollback_fraction
        self.keys = keys
        self.pad = pad
        self.all_destinations = all_destinations
        self.state = state
        self.keyed = keyed  # each entry's partition key is its key-value key
        self.noise = noise  # random padding (it does not compress)
        self.rolled_back: set[str] = set()
        self.committed = 0
        self.errors: list[str] = []
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _dests(self) -> list[str]:
        if self.all_destinations:
            return list(self.destinations)
        k = self.rng.randint(1, len(self.destinations))
        return sorted(self.rng.sample(self.destinations, k))

    def write_transaction(self, rollback: bool | None = None) -> int:
        """One application transaction; returns the entries it committed."""
        rng = self.rng
        client = rng.choice(sorted(self.apis))
        api = self.apis[client]
        if rollback is None:
            rollback = rng.random() < self.rollback_fraction
        ids: list[str] = []
        try:
            with Session(self.engine) as session, session.begin():
                messages: list[LRMessageWithDestinations] = []
                sent: list[dict[str, object]] = []
                for _ in range(rng.randint(1, self.max_batch)):
                    self._n += 1
                    pid = f"{self.prefix}-{self._n}"
                    key, value = f"k{rng.randrange(self.keys)}", self._n
                    dests = self._dests()
                    if self.state:
                        _upsert_source_kv(session, client, key, value)
                    messages.append(
                        LRMessageWithDestinations(
                            encode(pid, key, value, self.pad, self.noise),
                            dests,
                            key if self.keyed else None,
                        )
                    )
                    sent.append({"payload_id": pid, "client": client, "dests": ",".join(dests)})
                    ids.append(pid)
                if len(messages) == 1:
                    m = messages[0]
                    refs = [
                        api.transmit_log_entry_message(session, m.payload, m.destinations, m.key)
                    ]
                else:
                    refs = api.transmit_log_entry_messages(session, messages)
                for row, ref in zip(sent, refs, strict=True):
                    row.update(txid=ref.txid, ord=ref.ord, position=ref.position)
                session.execute(insert(rel_sent), sent)
                if rollback:
                    raise _Rollback
        except _Rollback:
            pass
        if rollback:
            self.rolled_back.update(ids)
            return 0
        self.committed += len(ids)
        if any(r["position"] is None for r in sent):
            self._record_positions(api, sent, refs)
        return len(ids)

    def _record_positions(
        self, api: RoutingQueueClient, sent: list[dict[str, object]], refs: Sequence[EntryRef]
    ) -> None:
        """Record the positions given after commit (read_sent resolves any left out)."""
        found = api.positions_of(refs, timeout=scaled(10.0))
        known = [
            {"pid": row["payload_id"], "pos": position}
            for row, position in zip(sent, found, strict=True)
            if position is not None
        ]
        if known:
            with self.engine.begin() as conn:
                conn.execute(
                    update(rel_sent)
                    .where(rel_sent.c.payload_id == bindparam("pid"))
                    .values(position=bindparam("pos")),
                    known,
                )

    def run(self, stop: threading.Event) -> None:
        """Write at ``rate`` entries per second until ``stop`` is set."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                n = self.write_transaction()
            except Exception as exc:  # keep going: the tests look at what committed
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                log.warning("source transaction failed: %s", exc)
                n = 1
            next_at += max(n, 1) / self.rate
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            elif delay < -1.0:
                next_at = time.monotonic()  # fell behind: do not burst to catch up

    def start(self) -> SourceApp:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(scaled(60))
            assert not self._thread.is_alive(), "source application did not stop"
            self._thread = None

    def sent(self) -> list[SentEntry]:
        return read_sent(self.engine, self.source)

    def snapshots(self) -> list[SnapshotInfo]:
        return read_snapshots(self.engine, self.source)

    def close(self) -> None:
        self.stop()
        self.engine.dispose()


def _upsert_source_kv(session: Session, client: str, key: str, value: int) -> None:
    t = rel_source_kv
    done = session.execute(
        update(t).where(t.c.client == client, t.c.key == key).values(value=value)
    )
    if not cast("CursorResult[Any]", done).rowcount:
        session.execute(insert(t).values(client=client, key=key, value=value))


def snapshot_provider(engine: Engine, *, chunk: int = 200, pause: float = 0.0) -> Any:
    """An in-process provider: every row of the client's source table, ``chunk`` at a time.

    ``pause`` seconds between chunks stretch the snapshot so faults can hit it.
    """

    def provide(ctx: SnapshotContext) -> None:
        t = rel_source_kv
        with engine.connect() as conn:
            rows = conn.execute(
                select(t.c.key, t.c.value).where(t.c.client == ctx.client_name).order_by(t.c.key)
            ).all()
        for i in range(0, len(rows), chunk):
            if ctx.is_cancelled():
                return
            part = rows[i : i + chunk]
            ctx.transmit([encode(f"s:{r.key}", r.key, r.value) for r in part])
            if pause:
                time.sleep(pause)

    return provide


def relay_snapshot_provider(engine: Engine, origin: str, *, chunk: int = 200) -> Any:
    """A branch's in-process provider: its own copy, the rows its listener applied from
    ``origin`` (``rel_sink_kv``), as the root's provider sends its source rows."""

    def provide(ctx: SnapshotContext) -> None:
        t = rel_sink_kv
        with engine.connect() as conn:
            rows = conn.execute(
                select(t.c.key, t.c.value)
                .where(t.c.client == ctx.client_name, t.c.source == origin)
                .order_by(t.c.key)
            ).all()
        for i in range(0, len(rows), chunk):
            if ctx.is_cancelled():
                return
            ctx.transmit([encode(f"s:{r.key}", r.key, r.value) for r in rows[i : i + chunk]])

    return provide


# -- the sink application -----------------------------------------------------------------
class RecordingListener(RoutingQueueListener):
    """Applies changes to ``rel_sink_kv`` and records each effect in ``rel_applied``.

    One instance serves one client's subscriber.
    """

    def __init__(self, client: str) -> None:
        self.client = client
        self.errors: list[str] = []

    def _record(
        self,
        session: Session,
        source: str,
        client: str,
        rows: list[tuple[int, str, str, str, str, int]],
    ) -> None:
        session.execute(
            insert(rel_applied),
            [
                {
                    "source": source,
                    "client": client,
                    "position": pos,
                    "payload_id": pid,
                    "kind": kind,
                    "snapshot_id": sid,
                    "key": key,
                    "value": value,
                }
                for pos, pid, kind, sid, key, value in rows
            ],
        )

    def _apply(self, session: Session, messages: Sequence[RoutingQueueMessage], kind: str) -> None:
        rows = []
        for m in messages:
            d = decode(m.payload)
            _upsert_sink_kv(session, m.source_id, m.client_name, d["k"], d["v"])
            rows.append((m.source_position, str(d["id"]), kind, m.snapshot_id, d["k"], d["v"]))
        if messages:
            self._record(session, messages[0].source_id, messages[0].client_name, rows)

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._record(session, source_id, self.client, [(0, "", START, snapshot_id, "", 0)])

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._record(session, source_id, self.client, [(0, "", END, snapshot_id, "", 0)])

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages, SNAPSHOT)
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages, LOG)
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(f"{type(error).__name__}: {error}"[:300])
        log.info("delivery failed (retried): %s", error)


def _upsert_sink_kv(session: Session, source: str, client: str, key: str, value: int) -> None:
    t = rel_sink_kv
    done = session.execute(
        update(t)
        .where(t.c.source == source, t.c.client == client, t.c.key == key)
        .values(value=value)
    )
    if not cast("CursorResult[Any]", done).rowcount:
        session.execute(insert(t).values(source=source, client=client, key=key, value=value))


class SinkApp:
    """In-process subscribers (one thread per client) applying with :class:`RecordingListener`."""

    def __init__(
        self,
        url: str,
        clients: Sequence[str] = ("policy",),
        *,
        batch_size: int = 100,
        lease_seconds: float = 5.0,
        poll_interval: float = 0.02,
        partitions: int = 1,
    ) -> None:
        self.engine = create_engine(url)
        self.store = open_store(self.engine)
        self.store.create_schema()
        self.partitions = partitions
        create_app_tables(self.engine, meta, SINK_TABLES)  # beside a running server
        self.listeners = {c: RecordingListener(c) for c in clients}
        self.subscribers = [
            RoutingQueueSubscriber(
                self.store,
                c,
                listener,
                batch_size=batch_size,
                lease_seconds=lease_seconds,
                poll_interval=poll_interval,
                retry_initial=0.05,
                retry_max=1.0,
                partitions=partitions,
            )
            for c, listener in self.listeners.items()
        ]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> SinkApp:
        """Start applying (again, after :meth:`stop`)."""
        if self._stop.is_set():
            self._stop = threading.Event()
        for sub in self.subscribers:
            t = threading.Thread(target=sub.run, args=(self._stop,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(scaled(30))
        self._threads.clear()

    def close(self) -> None:
        self.stop()
        self.engine.dispose()


# -- reading the records back ---------------------------------------------------------------
def read_sent(engine: Engine, source: str) -> list[SentEntry]:
    """What the source committed; a position not recorded yet is asked of the store and
    recorded (the application could not: a crash right after its commit). Trim
    removes what every destination has, and with it what the store knows of its
    position, so the position must be read before then."""
    t = rel_sent
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.payload_id, t.c.client, t.c.txid, t.c.ord, t.c.position, t.c.dests)
        ).all()
    missing = [EntryRef(int(r.txid), int(r.ord)) for r in rows if r.position is None]
    found = dict(zip(missing, open_store(engine).send.positions_of(missing), strict=True))
    known = [
        {"pid": r.payload_id, "pos": found[EntryRef(int(r.txid), int(r.ord))]}
        for r in rows
        if r.position is None and found[EntryRef(int(r.txid), int(r.ord))] is not None
    ]
    if known:  # kept: once trim has removed its entry, the store no longer knows it
        with engine.begin() as conn:
            stmt = update(t).where(t.c.payload_id == bindparam("pid"))
            conn.execute(stmt.values(position=bindparam("pos")), known)
    out = []
    for r in rows:
        position = r.position
        if position is None:
            position = found[EntryRef(int(r.txid), int(r.ord))]
            assert position is not None, f"{r.payload_id} committed but has no position"
        out.append(SentEntry(source, r.client, position, r.payload_id, tuple(r.dests.split(","))))
    return out


def read_applied(engine: Engine, sink: str, keyed: bool = False) -> list[AppliedEntry]:
    """What the sink's listener applied, in order; ``keyed``: each log entry's partition
    key is its key-value key (a sink delivering by partition promises per-key order)."""
    t = rel_applied
    with engine.connect() as conn:
        try:
            rows = conn.execute(select(t).order_by(t.c.id)).all()
        except Exception:  # the sink application has not created its tables yet
            return []
    return [
        AppliedEntry(
            sink,
            r.source,
            r.client,
            r.position,
            r.payload_id,
            r.kind,
            r.snapshot_id,
            r.id,
            r.key if keyed and r.kind == LOG else "",
        )
        for r in rows
    ]


def read_snapshots(engine: Engine, source: str) -> list[SnapshotInfo]:
    """Every snapshot once per destination in it (a shared snapshot serves several)."""
    t, d = lrq.snapshots, lrq.snapshot_destinations
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.snapshot_id, d.c.destination, t.c.client_name, t.c.base_position)
            .add_columns(t.c.entry_count)
            .join(d, d.c.snapshot_id == t.c.snapshot_id)
        ).all()
    return [
        SnapshotInfo(
            r.snapshot_id, source, r.destination, r.client_name, r.base_position or 0, r.entry_count
        )
        for r in rows
    ]


def source_state(engine: Engine) -> dict[tuple[str, str], int]:
    t = rel_source_kv
    with engine.connect() as conn:
        return {(r.client, r.key): r.value for r in conn.execute(select(t))}


def sink_state(engine: Engine, source: str) -> dict[tuple[str, str], int]:
    t = rel_sink_kv
    with engine.connect() as conn:
        rows = conn.execute(select(t).where(t.c.source == source)).all()
    return {(r.client, r.key): r.value for r in rows}


def send_queue_size(store: SQLAlchemyQueueStore) -> int:
    with store.read() as conn:
        return int(
            conn.execute(select(func.count()).select_from(lrq.send_log_entries)).scalar_one()
        )


__all__ = [
    "SINK_TABLES",
    "SOURCE_TABLES",
    "RecordingListener",
    "SinkApp",
    "SourceApp",
    "decode",
    "encode",
    "meta",
    "read_applied",
    "read_sent",
    "read_snapshots",
    "rel_applied",
    "rel_sent",
    "rel_sink_kv",
    "rel_source_kv",
    "send_queue_size",
    "sink_state",
    "snapshot_provider",
    "source_state",
]
