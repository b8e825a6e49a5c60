"""The sender API: transmit payloads inside the application's own transaction."""

from __future__ import annotations

import enum
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Protocol, overload

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from lr_client.cascade_roles import CascadeRole
from lr_client.errors import (
    BackpressureError,
    CascadeRouteError,
    InvalidDestinationsError,
    InvalidPayloadError,
    InvalidSessionError,
    UnknownDestinationError,
)
from lr_client.names import validate_name
from lr_client.reading import CachedReading
from lr_client.records import (
    CascadeRoute,
    EntryRef,
    LRMessageWithDestinations,
    SnapshotStatus,
    check_partition_key,
    check_payload,
)
from lr_client.snapshot_status import SnapshotInfo, parse_states
from lr_client.store import SendLog, Sites, Snapshots, open_store
from lr_client.store.lifecycle import SchemaStatus

#: Default payload limit, as Corfu's maximum message size.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
#: Distinct destination lists a client remembers as validated.
RESOLVED_CACHE_SIZE = 1024
#: How often :meth:`RoutingQueueClient.positions_of` asks again while waiting.
POSITION_POLL_S = 0.01


class TransmitStore(Sites, SendLog, Snapshots, Protocol):
    """What the sender API needs of the store: sites, the send log, snapshot requests."""


def _connection(session: Session | Connection) -> Connection:
    if isinstance(session, Session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    raise InvalidSessionError(
        f"expected a SQLAlchemy Session or Connection, got {type(session).__name__}"
    )


class Backpressure(enum.StrEnum):
    """What ``transmit`` does while the server holds a client under backpressure."""

    RAISE = "raise"  # raise BackpressureError at once
    WAIT = "wait"  # wait up to backpressure_timeout for it to lift, then raise
    IGNORE = "ignore"  # never check


class RoutingQueueClient:
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
    ) -> None:
        self.store: TransmitStore = (
            open_store(engine) if isinstance(engine, (Engine, str)) else engine
        )
        self.source_id = validate_name(source_id, "source site id")
        self.client_name = validate_name(client_name, "client name")
        if max_payload_bytes <= 0:
            raise ValueError("max_payload_bytes must be positive")
        self.max_payload_bytes = max_payload_bytes
        if backpressure not in tuple(Backpressure):
            raise ValueError("backpressure must be 'raise', 'wait' or 'ignore'")
        self.backpressure = Backpressure(backpressure)
        if backpressure_timeout < 0 or flow_check_interval < 0:
            raise ValueError("backpressure_timeout and flow_check_interval must be >= 0")
        self.backpressure_timeout = backpressure_timeout
        self.flow_check_interval = flow_check_interval
        self._flow: CachedReading[tuple[bool, list[str]]] = CachedReading(
            lambda: self.store.flow_state(self.client_name), flow_check_interval
        )
        self._route: CachedReading[CascadeRoute | None] = CachedReading(
            lambda: self.store.transmit_route(self.client_name), flow_check_interval
        )
        #: Destination lists already validated, with their site numbers (numbers never change).
        self._resolved: dict[tuple[object, ...], list[int]] = {}

    def _flow_state(self, fresh: bool = False) -> tuple[bool, list[str]]:
        return self._flow.get(fresh)

    def _check_backpressure(self) -> None:
        if self.backpressure is Backpressure.IGNORE:
            return
        on, slow = self._flow_state()
        if not on:
            return
        # The cached state said "on": confirm it before refusing, so a caller that
        # saw backpressure lift is never refused on a stale reading.
        on, slow = self._flow_state(fresh=True)
        if not on:
            return
        if self.backpressure is Backpressure.WAIT:
            deadline = time.monotonic() + self.backpressure_timeout
            while on and time.monotonic() < deadline:
                pause = max(self.flow_check_interval, 0.01)  # never a busy loop
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                on, slow = self._flow_state()
            if not on:
                return
        raise BackpressureError(
            f"most destinations of {self.client_name!r} are behind ({', '.join(slow)}); retry later"
        )

    def _route_state(self, fresh: bool = False) -> CascadeRoute | None:
        return self._route.get(fresh)

    def _route_refusal(self, route: CascadeRoute | None, names: set[str]) -> str:
        """Why ``route`` refuses a transmit to ``names`` ('' if it does not)."""
        if route is None:
            return ""
        if route.role != CascadeRole.ROOT or route.origin_id != self.source_id:
            return (
                f"{self.client_name!r} is cascaded from its root {route.origin_id}: only the "
                f"root transmits it, not {self.source_id} (a {route.role} of its set)"
            )
        outside = sorted(names - set(route.nodes)) if route.nodes is not None else []
        if outside:
            return (
                f"{', '.join(outside)}: not a node of the set of {self.client_name!r} "
                f"(nodes: {', '.join(route.nodes or ())})"
            )
        return ""

    def _check_route(self, destinations: Iterable[Sequence[str]]) -> None:
        names = {d for ds in destinations for d in ds}
        if not self._route_refusal(self._route_state(), names):
            return
        why = self._route_refusal(self._route_state(fresh=True), names)
        if why:
            raise CascadeRouteError(why)

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade the queue store's tables (what ``lr init-db`` does); idempotent.

        Safe when several processes run it at once. Returns the schema's status before.
        """
        return self.store.create_schema()

    def register_destinations(self, destinations: Iterable[str]) -> None:
        """Register sites this client may send to."""
        self.store.register_sites(list(destinations))

    # -- validation ------------------------------------------------------------------
    def _dest_nums(self, destinations: object) -> list[int]:
        key: tuple[object, ...] | None = (
            tuple(destinations) if isinstance(destinations, (list, tuple)) else None
        )
        if key is not None:
            try:
                return self._resolved[key]
            except (KeyError, TypeError):  # new, or an unhashable element
                pass
        nums = self._resolve(destinations)
        if key is not None and len(self._resolved) < RESOLVED_CACHE_SIZE:
            self._resolved[key] = nums
        return nums

    def _resolve(self, destinations: object) -> list[int]:
        if isinstance(destinations, (str, bytes)) or not isinstance(destinations, Sequence):
            raise InvalidDestinationsError(
                f"destinations must be a list of site ids, got {type(destinations).__name__}"
            )
        if not destinations:
            raise InvalidDestinationsError("destinations must not be empty")
        names = [validate_name(d, "destination site id") for d in destinations]
        if len(set(names)) != len(names):
            raise InvalidDestinationsError(f"duplicate destinations in {names!r}")
        if self.source_id in names:
            raise InvalidDestinationsError(f"a site cannot send to itself ({self.source_id!r})")
        known = self.store.site_numbers()
        if any(n not in known for n in names):
            known = self.store.site_numbers(refresh=True)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UnknownDestinationError(f"unknown destinations: {', '.join(unknown)}")
        return [known[n] for n in names]

    def _payload(self, payload: object) -> bytes:
        return check_payload(payload, self.max_payload_bytes)

    # -- transmit ----------------------------------------------------------------------
    def transmit_log_entry_message(
        self,
        session: Session | Connection,
        payload: bytes,
        destinations: Sequence[str],
        key: bytes | str | None = None,
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
        """
        conn = _connection(session)
        row = (self._payload(payload), self._dest_nums(destinations), check_partition_key(key))
        self._check_route([destinations])
        self._check_backpressure()
        return self.store.append_log_entries(conn, self.client_name, [row])[0]

    def transmit_log_entry_messages(
        self, session: Session | Connection, messages: Sequence[LRMessageWithDestinations]
    ) -> list[EntryRef]:
        """Queue several payloads in the caller's transaction; all or none are valid.

        Each message's ``key`` is its partition key, as for
        :meth:`transmit_log_entry_message`.
        """
        conn = _connection(session)
        rows = []
        for m in messages:
            if not isinstance(m, LRMessageWithDestinations):
                raise InvalidPayloadError(
                    f"expected LRMessageWithDestinations, got {type(m).__name__}"
                )
            rows.append(
                (
                    self._payload(m.payload),
                    self._dest_nums(m.destinations),
                    check_partition_key(m.key),
                )
            )
        self._check_route([m.destinations for m in messages])
        self._check_backpressure()
        return self.store.append_log_entries(conn, self.client_name, rows)

    def positions_of(self, refs: Sequence[EntryRef], timeout: float = 0.0) -> list[int | None]:
        """The positions of transmitted entries, waiting up to ``timeout`` s for all.

        None for an entry without one by then: its transaction has not
        committed (or rolled back), or, on PostgreSQL, the entry was
        delivered everywhere and trimmed: a position is known for at least
        one ``[retention] rotation_period`` (30 s) after the commit.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.store.positions_of(refs)
            if None not in found or time.monotonic() >= deadline:
                return found
            time.sleep(POSITION_POLL_S)

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
        if not isinstance(destination, str):
            raise InvalidDestinationsError(
                f"destination must be a site id, got {type(destination).__name__}"
            )
        if isinstance(session, str):
            raise InvalidSessionError("session must be a SQLAlchemy Session or Connection")
        self._dest_nums([destination])
        conn = None if session is None else _connection(session)
        return self.store.request_snapshot(conn, destination, self.client_name, reason)

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
        if destination is not None:
            destination = validate_name(destination, "destination site id")
        wanted = parse_states(states)
        found = self.store.list_snapshots(destination, self.client_name, wanted)
        return [SnapshotInfo.from_request(r) for r in found]

    def snapshot(self, snapshot_id: str, destination: str | None = None) -> SnapshotInfo | None:
        """One full sync of this client by id (as :meth:`request_snapshot_sync` returned it).

        A snapshot may be shared by several destinations: with ``destination``,
        that destination's state and shipped rows; without, the snapshot's own.
        """
        if destination is not None:
            destination = validate_name(destination, "destination site id")
        req = self.store.get_snapshot(snapshot_id, destination)
        if req is None or req.client_name != self.client_name:
            return None
        return SnapshotInfo.from_request(req)
