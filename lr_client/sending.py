"""The sender's rules, shared by the sync and the async client: each operation as steps.

Each operation of the sender API (transmit, a snapshot request, waiting for
positions) is written once, here, as a generator that does no I/O of its own
(httpx/h11's sans-I/O core). It validates its input, then yields what it needs
done, and returns its result:

- :class:`~lr_client.steps.Blocking`: a call that reads the client's own store
  (its sync engine: the flow state, the cascade route, the registered sites) or
  writes in a transaction of its own; the result is sent back;
- :class:`~lr_client.steps.InTransaction`: a call to run on the caller's
  connection, inside its transaction (the append itself); the result is sent back;
- a ``float``: seconds to wait before going on (backpressure in ``"wait"`` mode,
  a poll for positions).

A step is yielded only when needed: a transmit whose readings are cached and
fresh yields its :class:`~lr_client.steps.InTransaction` alone.
:func:`~lr_client.steps.run` drives the steps for the sync client
(:class:`~lr_client.sender.RoutingQueueClient`); :mod:`lr_client.aio.sender`
drives the same steps from an event loop. The rules, the records, the SQL and
the typed errors are therefore one
implementation; only execution differs. Every error of bad input is raised
before the first :class:`~lr_client.steps.InTransaction`: nothing is written.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from lr_client import tracing
from lr_client.cascade_roles import CascadeRole
from lr_client.encryption import seal
from lr_client.errors import (
    BackpressureError,
    CascadeRouteError,
    InvalidDestinationsError,
    InvalidPayloadError,
    UnknownDestinationError,
)
from lr_client.headers import check_headers, encode_headers
from lr_client.keys import Keyring
from lr_client.names import validate_name
from lr_client.reading import CachedReading
from lr_client.records import (
    CascadeRoute,
    EntryRef,
    LRMessageWithDestinations,
    NewLogEntry,
    SnapshotRequest,
    SnapshotStatus,
    check_partition_key,
    check_payload,
)
from lr_client.sealed_headers import seal_headers
from lr_client.snapshot_status import SnapshotInfo, parse_states
from lr_client.steps import Blocking, InTransaction, Steps, read_cached
from lr_client.store import SendLog, Sites, SnapshotEntries, SnapshotRequests, Transactions
from lr_client.store.schema.lifecycle import SchemaStatus

T = TypeVar("T")

#: Default payload limit, as Corfu's maximum message size.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
#: Distinct destination lists a client remembers as validated.
RESOLVED_CACHE_SIZE = 1024
#: How often ``positions_of`` asks again while waiting.
POSITION_POLL_S = 0.01


class TransmitStore(Transactions, Protocol):
    """What the sender API needs of the store: sites, the send log, snapshot requests."""

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade every table (idempotent); the schema's status before."""

    def close(self) -> None:
        """Close the store's connections; a later call reconnects."""

    sites: Sites
    send: SendLog
    snapshots: SnapshotRequests
    snapshot_entries: SnapshotEntries


class Backpressure(enum.StrEnum):
    """What ``transmit`` does while the server holds a client under backpressure."""

    RAISE = "raise"  # raise BackpressureError at once
    WAIT = "wait"  # wait up to backpressure_timeout for it to lift, then raise
    IGNORE = "ignore"  # never check


class SenderRules:
    """One client's rules: validation, destinations, cascade route and backpressure.

    Holds the client's settings and its cached readings (shared by the threads
    or tasks that use the client); see :class:`~lr_client.sender.RoutingQueueClient`
    for what each setting means.
    """

    def __init__(
        self,
        store: TransmitStore,
        source_id: str,
        client_name: str,
        *,
        max_payload_bytes: int,
        backpressure: Backpressure | str,
        backpressure_timeout: float,
        flow_check_interval: float,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = store
        #: Seals every payload for its destinations (:mod:`lr_client.encryption`); None: not.
        self.keyring = keyring
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
        self.flow: CachedReading[tuple[bool, list[str]]] = CachedReading(
            lambda: store.send.flow_state(self.client_name), flow_check_interval
        )
        self.route: CachedReading[CascadeRoute | None] = CachedReading(
            lambda: store.send.transmit_route(self.client_name), flow_check_interval
        )
        #: Destination lists already validated, with their site numbers (numbers never change).
        self.resolved: dict[tuple[object, ...], list[int]] = {}

    # -- the operations ------------------------------------------------------------------
    def transmit(
        self, payload: object, destinations: object, key: object = None, headers: object = None
    ) -> Steps[EntryRef]:
        """Append one payload for ``destinations`` in the caller's transaction."""
        stamp = tracing.transmit_stamp(self.source_id, self.client_name)
        data = check_payload(payload, self.max_payload_bytes)
        nums = yield from self.dest_nums(destinations)
        row = self._row(data, destinations, nums, key, headers, stamp)
        yield from self._check_route([destinations])  # type: ignore[list-item]
        yield from self._check_backpressure()
        refs: list[EntryRef] = yield InTransaction(
            lambda conn: self.store.send.append_log_entries(conn, self.client_name, [row])
        )
        return refs[0]

    def transmit_many(self, messages: Sequence[object]) -> Steps[list[EntryRef]]:
        """Append several payloads in the caller's transaction; all or none are valid."""
        rows: list[NewLogEntry] = []
        routes: dict[int, Sequence[str]] = {}  # each destination list once (the cache's)
        stamp = tracing.transmit_stamp(self.source_id, self.client_name)
        resolved, limit = self.resolved, self.max_payload_bytes
        bare = self.keyring is None and stamp is tracing.UNCHANGED  # rows as given
        last: object = None  # the previous message's destination list and its numbers
        nums: list[int] | None = None
        for m in messages:
            if not isinstance(m, LRMessageWithDestinations):
                raise InvalidPayloadError(
                    f"expected LRMessageWithDestinations, got {type(m).__name__}"
                )
            payload = check_payload(m.payload, limit)
            dests = m.destinations
            if dests is not last or nums is None:  # the same list again: the same numbers
                nums = None
                if isinstance(dests, (list, tuple)):  # a list resolved already: no step
                    with contextlib.suppress(TypeError):  # unhashable: dest_nums says why
                        nums = resolved.get(tuple(dests))
                if nums is None:
                    nums = yield from self.dest_nums(dests)
                routes[id(nums)] = dests  # the numbers' lists are alive in rows: ids are unique
                last = dests
            if bare and m.key is None and m.headers is None:
                rows.append((payload, nums, None, None))
            else:
                rows.append(self._row(payload, dests, nums, m.key, m.headers, stamp))
        yield from self._check_route(routes.values())
        yield from self._check_backpressure()
        refs: list[EntryRef] = yield InTransaction(
            lambda conn: self.store.send.append_log_entries(conn, self.client_name, rows)
        )
        return refs

    def _row(
        self,
        data: bytes,
        destinations: Any,
        nums: list[int],
        key: object,
        headers: object,
        stamp: tracing.Stamp,
    ) -> NewLogEntry:
        """The row of a checked payload to checked ``destinations``: its key and headers
        checked, sealed under the keyring, stamped with the trace context if traced."""
        partition_key = None if key is None else check_partition_key(key)
        given = None if headers is None else check_headers(headers)
        if self.keyring is not None:
            data = self.seal(data, destinations)
            given = self.seal_headers(given, destinations)
        untraced = given is None and stamp is tracing.UNCHANGED
        return (data, nums, partition_key, None if untraced else encode_headers(stamp(given)))

    def request_snapshot(
        self, destination: object, in_transaction: bool, reason: str
    ) -> Steps[str]:
        """Ask for a full sync to ``destination``: in the caller's transaction, or in one
        of its own."""
        if not isinstance(destination, str):
            raise InvalidDestinationsError(
                f"destination must be a site id, got {type(destination).__name__}"
            )
        yield from self.dest_nums([destination])
        request = self.store.snapshots.request_snapshot
        if in_transaction:
            sid: str = yield InTransaction(
                lambda conn: request(conn, destination, self.client_name, reason)
            )
            return sid
        own: str = yield Blocking(lambda: request(None, destination, self.client_name, reason))
        return own

    def positions(self, refs: Sequence[EntryRef], timeout: float) -> Steps[list[int | None]]:
        """The positions of ``refs``, asking again every ``POSITION_POLL_S`` until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found: list[int | None] = yield Blocking(lambda: self.store.send.positions_of(refs))
            if None not in found or time.monotonic() >= deadline:
                return found
            yield POSITION_POLL_S

    def snapshots(
        self, destination: str | None, states: Iterable[SnapshotStatus | str] | None
    ) -> Steps[list[SnapshotInfo]]:
        """This client's full syncs to ``destination`` in ``states`` (None: any), newest first."""
        if destination is not None:
            destination = validate_name(destination, "destination site id")
        wanted = parse_states(states)
        found: list[SnapshotRequest] = yield Blocking(
            lambda: self.store.snapshots.list_snapshots(destination, self.client_name, wanted)
        )
        return [SnapshotInfo.from_request(r) for r in found]

    def snapshot(self, snapshot_id: str, destination: str | None) -> Steps[SnapshotInfo | None]:
        """One full sync of this client by id (``destination``'s view of it, if given)."""
        if destination is not None:
            destination = validate_name(destination, "destination site id")
        req: SnapshotRequest | None = yield Blocking(
            lambda: self.store.snapshots.get_snapshot(snapshot_id, destination)
        )
        if req is None or req.client_name != self.client_name:
            return None
        return SnapshotInfo.from_request(req)

    def seal(self, payload: bytes, destinations: Sequence[str]) -> bytes:
        """``payload`` encrypted for ``destinations`` (validated) under the keyring."""
        assert self.keyring is not None
        return seal(self.keyring, payload, destinations, self.source_id, self.client_name)

    def seal_headers(
        self, headers: dict[str, str] | None, destinations: Sequence[str]
    ) -> dict[str, str] | None:
        """``headers`` with those the keyring names sealed (:mod:`lr_client.sealed_headers`)."""
        assert self.keyring is not None
        return seal_headers(self.keyring, headers, destinations, self.source_id, self.client_name)

    # -- destinations --------------------------------------------------------------------
    def dest_nums(self, destinations: object) -> Steps[list[int]]:
        """The site numbers of a destination list, validated (remembered once valid)."""
        key: tuple[object, ...] | None = (
            tuple(destinations) if isinstance(destinations, (list, tuple)) else None
        )
        if key is not None:
            try:
                return self.resolved[key]
            except (KeyError, TypeError):  # new, or an unhashable element
                pass
        names = self._names(destinations)
        known: dict[str, int] = yield Blocking(self.store.sites.site_numbers)
        if any(n not in known for n in names):
            known = yield Blocking(lambda: self.store.sites.site_numbers(refresh=True))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UnknownDestinationError(f"unknown destinations: {', '.join(unknown)}")
        nums = [known[n] for n in names]
        if key is not None and len(self.resolved) < RESOLVED_CACHE_SIZE:
            self.resolved[key] = nums
        return nums

    def _names(self, destinations: object) -> list[str]:
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
        return names

    # -- cascade route and backpressure --------------------------------------------------
    def route_refusal(self, route: CascadeRoute | None, names: set[str]) -> str:
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

    def _check_route(self, destinations: Iterable[Sequence[str]]) -> Steps[None]:
        route = yield from read_cached(self.route)
        if route is None:  # not cascaded: any registered destination
            return
        names = {d for ds in destinations for d in ds}
        if not self.route_refusal(route, names):
            return
        # A refusal is confirmed on a fresh reading.
        why = self.route_refusal((yield from read_cached(self.route, fresh=True)), names)
        if why:
            raise CascadeRouteError(why)

    def _check_backpressure(self) -> Steps[None]:
        if self.backpressure is Backpressure.IGNORE:
            return
        on, slow = yield from read_cached(self.flow)
        if not on:
            return
        # The cached state said "on": confirm it before refusing, so a caller that
        # saw backpressure lift is never refused on a stale reading.
        on, slow = yield from read_cached(self.flow, fresh=True)
        if not on:
            return
        if self.backpressure is Backpressure.WAIT:
            deadline = time.monotonic() + self.backpressure_timeout
            while on and time.monotonic() < deadline:
                pause = max(self.flow_check_interval, 0.01)  # never a busy loop
                yield min(pause, max(0.0, deadline - time.monotonic()))
                on, slow = yield from read_cached(self.flow)
            if not on:
                return
        raise BackpressureError(
            f"most destinations of {self.client_name!r} are behind ({', '.join(slow)}); retry later"
        )


__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "POSITION_POLL_S",
    "RESOLVED_CACHE_SIZE",
    "Backpressure",
    "SenderRules",
    "TransmitStore",
]
