"""The sender API: transmit payloads inside the application's own transaction.

The rules (validation, destinations, cascade route, backpressure) and each
operation's steps are :mod:`lr_client.sending`'s, shared with the async client
(:mod:`lr_client.aio.sender`); this client runs them in the calling thread.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeGuard, overload

from sqlalchemy.engine import Connection, Engine

from lr_client.errors import InvalidSessionError
from lr_client.keys import Keyring
from lr_client.records import EntryRef, LRMessageWithDestinations, SnapshotStatus
from lr_client.sending import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Backpressure,
    SenderRules,
    TransmitStore,
)
from lr_client.snapshot_status import SnapshotInfo
from lr_client.steps import run
from lr_client.store import open_store
from lr_client.store.schema.lifecycle import SchemaStatus

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _is_orm_session(session: object) -> TypeGuard[Session]:
    """A SQLAlchemy ``Session`` (none exists unless the application imported the ORM)."""
    orm = sys.modules.get("sqlalchemy.orm")
    return orm is not None and isinstance(session, orm.Session)


def _connection(session: Session | Connection) -> Connection:
    if _is_orm_session(session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    raise InvalidSessionError(
        f"expected a SQLAlchemy Session or Connection, got {type(session).__name__}"
    )


class SenderSettings:
    """The settings both clients read back (the rules hold them)."""

    rules: SenderRules
    store: TransmitStore

    @property
    def source_id(self) -> str:
        """This site's id."""
        return self.rules.source_id

    @property
    def client_name(self) -> str:
        """The client (stream) this sender transmits."""
        return self.rules.client_name

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload accepted."""
        return self.rules.max_payload_bytes

    @property
    def backpressure(self) -> Backpressure:
        """What a transmit does under backpressure."""
        return self.rules.backpressure

    @property
    def backpressure_timeout(self) -> float:
        """Seconds a transmit waits in ``"wait"`` mode."""
        return self.rules.backpressure_timeout

    @property
    def flow_check_interval(self) -> float:
        """Seconds a reading of the flow state and route is reused."""
        return self.rules.flow_check_interval

    @property
    def keyring(self) -> Keyring | None:
        """The keys payloads are sealed with (None: sent as given)."""
        return self.rules.keyring


class RoutingQueueClient(SenderSettings):
    """Transmits payloads to remote sites, atomically with the application's writes.

    ``destinations`` must be registered sites (``lr init-db`` and ``lr server``
    register those of the site config; :meth:`register_destinations` does it
    from code). Duplicate destinations in one message are rejected, not
    deduplicated: a list with a repeat is almost always a bug in the caller.

    Backpressure: when the site's server finds most of this client's
    destinations too far behind, ``transmit`` either raises
    :class:`~lr_client.errors.BackpressureError` at once (``backpressure="raise"``,
    the default) or waits up to ``backpressure_timeout`` seconds for them to
    recover before raising (``"wait"``); ``"ignore"`` never checks. The check
    happens before anything is written. The state is read from the database at
    most every ``flow_check_interval`` seconds (0: on every transmit), by one
    of the threads sharing the client at a time (the others go on with the last
    reading meanwhile); a cached "on" is confirmed before a transmit is
    refused, and a cached "off" may let transmits through for up to that long
    (and one reading's duration) after backpressure begins.

    A cascaded client (docs/cascading.md) is transmitted at the root of its set
    only, and names nodes of its set only: anything else raises
    :class:`~lr_client.errors.CascadeRouteError` and writes nothing. The route
    is read from the database (``lr server`` records it at start) at most every
    ``flow_check_interval`` seconds; a refusal is confirmed on a fresh reading.

    With a ``keyring`` (:class:`~lr_client.keys.Keyring`) every payload is encrypted
    here, before it is written (:mod:`lr_client.encryption`): the send queue, the
    wire and every relay hold ciphertext, which only a sink holding the key of a
    destination it was sealed for decrypts (its subscriber, given the keyring).
    The payload limit applies to the plaintext.
    """

    def __init__(
        self,
        engine: Engine | TransmitStore,
        source_id: str,
        client_name: str,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        backpressure: Backpressure | str = Backpressure.RAISE,
        backpressure_timeout: float = 30.0,
        flow_check_interval: float = 0.25,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = open_store(engine) if isinstance(engine, (Engine, str)) else engine
        self.rules = SenderRules(
            self.store,
            source_id,
            client_name,
            max_payload_bytes=max_payload_bytes,
            backpressure=backpressure,
            backpressure_timeout=backpressure_timeout,
            flow_check_interval=flow_check_interval,
            keyring=keyring,
        )

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade the queue store's tables (what ``lr init-db`` does); idempotent.

        Safe when several processes run it at once. Returns the schema's status before.
        """
        return self.store.create_schema()

    def register_destinations(self, destinations: Iterable[str]) -> None:
        """Register sites this client may send to."""
        self.store.sites.register_sites(list(destinations))

    # -- transmit ----------------------------------------------------------------------
    def transmit_log_entry_message(
        self,
        session: Session | Connection,
        payload: bytes,
        destinations: Sequence[str],
        key: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> EntryRef:
        """Queue one payload for ``destinations`` in the caller's transaction.

        Nothing is sent unless the transaction commits. Returns a ref to the
        entry: positions are given in commit order, so on PostgreSQL the
        position is known only after commit (:meth:`positions_of`).

        ``key``, the entry's partition key (bytes, or str as UTF-8; at most
        :data:`~lr_client.records.MAX_PARTITION_KEY_BYTES`), travels with it to
        the sink: a subscriber delivering by partition keeps the entries of one
        key in order and delivers different keys in parallel. An entry without
        a key is delivered in order relative to every other entry. A bad key
        raises :class:`~lr_client.errors.InvalidPartitionKeyError` and writes
        nothing.

        ``headers``, a small ``str -> str`` map (e.g. ``{"content-type":
        "application/json"}``), is stored once with the payload and given to
        the listener as ``message.headers`` (:mod:`lr_client.headers` for the
        limits; names starting ``lr-`` are the library's). Bad headers raise
        :class:`~lr_client.errors.InvalidHeadersError` and write nothing.
        """
        conn = _connection(session)
        return run(self.rules.transmit(payload, destinations, key, headers), conn)

    def transmit_log_entry_messages(
        self, session: Session | Connection, messages: Sequence[LRMessageWithDestinations]
    ) -> list[EntryRef]:
        """Queue several payloads in the caller's transaction; all or none are valid.

        Each message's ``key`` and ``headers`` are as for
        :meth:`transmit_log_entry_message`.
        """
        conn = _connection(session)
        return run(self.rules.transmit_many(messages), conn)

    def positions_of(self, refs: Sequence[EntryRef], timeout: float = 0.0) -> list[int | None]:
        """The positions of transmitted entries, waiting up to ``timeout`` s for all.

        None for an entry without one by then: its transaction has not
        committed (or rolled back), or, on PostgreSQL, the entry was
        delivered everywhere and trimmed: a position is known for at least
        one ``[retention] rotation_period`` (30 s) after the commit.
        """
        return run(self.rules.positions(refs, timeout))

    @overload
    def request_snapshot_sync(
        self,
        destination: str,
        session: Session | Connection | None = None,
        *,
        reason: str = "application",
    ) -> str: ...

    @overload
    def request_snapshot_sync(
        self,
        destination: Session | Connection | None,
        session: str,
        reason: str = "application",
    ) -> str: ...

    def request_snapshot_sync(
        self,
        destination: str | Session | Connection | None,
        session: Session | Connection | str | None = None,
        reason: str = "application",
    ) -> str:
        """Ask for a full sync of this client to ``destination``; return the snapshot id.

        With ``session`` the request is written in the caller's transaction
        (it exists only if that commits); without, in its own. The
        destination leaves its open snapshot of the client (which goes on for
        the other destinations in it) and joins the client's snapshot it may
        join (one not started yet, or one whose base is at or past its
        acknowledged position and it was not dropped), else a new one: the id
        may be one other destinations share. The client's snapshot provider
        is configured on the server, which this call cannot see: for a
        client with ``snapshot = "none"`` the running server cancels
        the request (reason ``... has no snapshot provider ...``) and log
        entries go on. Follow it with :meth:`snapshot` or :meth:`snapshots`.

        The older order ``request_snapshot_sync(session, destination)`` still
        works for one release and emits a :class:`DeprecationWarning`.
        """
        if not isinstance(destination, str) and isinstance(session, str):
            warnings.warn(
                "request_snapshot_sync(session, destination) is deprecated: "
                "call request_snapshot_sync(destination, session=session)",
                DeprecationWarning,
                stacklevel=2,
            )
            destination, session = session, destination
        if isinstance(session, str):
            raise InvalidSessionError("session must be a SQLAlchemy Session or Connection")
        conn = None if session is None else _connection(session)
        return run(self.rules.request_snapshot(destination, conn is not None, reason), conn)

    def snapshots(
        self,
        destination: str | None = None,
        states: Iterable[SnapshotStatus | str] | None = None,
    ) -> list[SnapshotInfo]:
        """This client's full syncs, newest first: to ``destination`` (None: every
        destination) in ``states`` (None: every state; e.g. ``["running", "ready"]``).

        Raises :class:`~lr_client.errors.InvalidInputError` for an unknown state
        or a malformed destination.
        """
        return run(self.rules.snapshots(destination, states))

    def snapshot(self, snapshot_id: str, destination: str | None = None) -> SnapshotInfo | None:
        """One full sync of this client by id (as :meth:`request_snapshot_sync` returned it).

        A snapshot may be shared by several destinations: with ``destination``,
        that destination's state and shipped rows; without, the snapshot's own.
        """
        return run(self.rules.snapshot(snapshot_id, destination))


__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Backpressure",
    "RoutingQueueClient",
    "SenderSettings",
    "TransmitStore",
]
