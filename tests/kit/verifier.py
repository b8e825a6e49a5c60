"""Check end to end what reached the listeners against what the sources transmitted.

The source application records each payload it transmits (``SentEntry``: its
position, payload id and destinations) in the transmitting transaction; each
sink application records what its listener applied (``AppliedEntry``) in the
delivery transaction. :func:`verify` compares the two, per stream
``(source, destination, client)``, and reports:

* **lost**: a committed entry for the destination that its listener never
  applied (and that no completed snapshot covers, see below);
* **duplicated**: a position applied more than once (within one epoch, below);
* **out of order**: an applied log entry whose position is not above the one
  applied before it (first occurrences, in apply order), a log entry applied
  inside a completed snapshot, or one at or below the base of the snapshot it
  follows (I2). A log entry with a partition key (``key``) need only be
  above the entries of its own key applied before it and above every entry
  without a key applied before it (a sink delivering by partition applies
  different keys in any interleaving); an entry without a key must be above
  every entry applied before it, keyed or not;
* **unexpected**: a position applied that was never committed for that
  destination (a rolled-back transmit, or an entry of another destination);
* **corrupt**: a position applied with another payload id than the one sent;
* **snapshot** problems: per completed snapshot (its end was applied), the
  entries 1..N applied exactly once, in order, N as the source counted.

A completed snapshot with base position B *covers* the stream's entries at or
below B: the snapshot holds their effect, so they need not arrive as log
entries (they may, before the snapshot). It also starts a new *epoch*: the
source resumes after B, so entries above B are applied after the snapshot's
end even if they were applied before it (the documented replay; apply is
idempotent per key). An entry above B applied only before the snapshot is
lost: the snapshot may have overwritten its effect.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

StreamKey = tuple[str, str, str]
"""``(source, destination, client)``."""

LOG, SNAPSHOT, START, END = "log", "snapshot", "start", "end"


@dataclass(frozen=True, slots=True)
class SentEntry:
    """One committed transmit, as the source application recorded it."""

    source: str
    client: str
    position: int
    payload_id: str
    destinations: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AppliedEntry:
    """One listener effect, as the sink application recorded it.

    ``kind`` is ``log`` or ``snapshot`` (one message), ``start`` or ``end``
    (a full sync callback; position 0). ``order`` is the sink's apply order
    (an autoincrement id written in the delivery transaction).
    """

    sink: str
    source: str
    client: str
    position: int
    payload_id: str = ""
    kind: str = LOG
    snapshot_id: str = ""
    order: int = 0
    key: str = ""  # the entry's partition key ("": none)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot as the source recorded it (``lrq_snapshots``)."""

    snapshot_id: str
    source: str
    destination: str
    client: str
    base_position: int
    entry_count: int | None


@dataclass
class StreamReport:
    """What went wrong in one ``(source, destination, client)`` stream."""

    key: StreamKey
    expected: int = 0
    applied: int = 0
    covered: int = 0
    lost: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    out_of_order: list[tuple[int, int]] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)
    snapshots_completed: int = 0
    snapshot_entries: int = 0
    snapshot_problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.out_of_order
            or self.unexpected
            or self.corrupt
            or self.snapshot_problems
        )


@dataclass
class Report:
    """Every stream's report and the totals the tests assert on."""

    streams: dict[StreamKey, StreamReport]
    rolled_back_delivered: list[str] = field(default_factory=list)

    def _sum(self, name: str) -> int:
        return sum(len(getattr(r, name)) for r in self.streams.values())

    @property
    def lost(self) -> int:
        return self._sum("lost")

    @property
    def duplicated(self) -> int:
        return self._sum("duplicated")

    @property
    def out_of_order(self) -> int:
        return self._sum("out_of_order")

    @property
    def unexpected(self) -> int:
        return self._sum("unexpected")

    @property
    def corrupt(self) -> int:
        return self._sum("corrupt")

    @property
    def snapshot_problems(self) -> int:
        return self._sum("snapshot_problems")

    @property
    def expected(self) -> int:
        return sum(r.expected for r in self.streams.values())

    @property
    def applied(self) -> int:
        return sum(r.applied for r in self.streams.values())

    @property
    def clean(self) -> bool:
        return all(r.clean for r in self.streams.values()) and not self.rolled_back_delivered

    def counts(self) -> dict[str, int]:
        """The figures a test asserts (all but ``expected``/``applied`` must be 0)."""
        return {
            "expected": self.expected,
            "applied": self.applied,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "unexpected": self.unexpected,
            "corrupt": self.corrupt,
            "snapshot_problems": self.snapshot_problems,
            "rolled_back_delivered": len(self.rolled_back_delivered),
        }

    def summary(self, limit: int = 8) -> str:
        """One line per stream with problems (the first ``limit`` of each kind)."""
        lines = [" ".join(f"{k}={v}" for k, v in self.counts().items())]
        for key, r in sorted(self.streams.items()):
            if r.clean:
                continue
            parts = [f"{'/'.join(key)}: expected={r.expected} applied={r.applied}"]
            for name in ("lost", "duplicated", "out_of_order", "unexpected", "corrupt"):
                items = getattr(r, name)
                if items:
                    parts.append(f"{name}={len(items)} {items[:limit]}")
            parts += r.snapshot_problems[:limit]
            lines.append("  " + "; ".join(parts))
        if self.rolled_back_delivered:
            lines.append(f"  rolled back but delivered: {self.rolled_back_delivered[:limit]}")
        return "\n".join(lines)

    def assert_clean(self) -> None:
        assert self.clean, "replication check failed:\n" + self.summary()


def verify(
    sent: Iterable[SentEntry],
    applied: Iterable[AppliedEntry],
    *,
    snapshots: Iterable[SnapshotInfo] = (),
    rolled_back: Iterable[str] = (),
    destinations: Iterable[str] | None = None,
) -> Report:
    """Compare what was sent with what was applied; see the module docstring.

    ``destinations`` limits the check to those sinks (default: every
    destination named in ``sent``). ``rolled_back`` are payload ids of
    transmits whose transaction rolled back: none may be applied anywhere.
    """
    wanted = set(destinations) if destinations is not None else None
    sent_by: dict[StreamKey, dict[int, str]] = defaultdict(dict)
    for s in sent:
        for d in s.destinations:
            if wanted is None or d in wanted:
                sent_by[(s.source, d, s.client)][s.position] = s.payload_id
    applied_by: dict[StreamKey, list[AppliedEntry]] = defaultdict(list)
    for a in applied:
        if wanted is None or a.sink in wanted:
            applied_by[(a.source, a.sink, a.client)].append(a)
    snaps = {s.snapshot_id: s for s in snapshots}

    streams: dict[StreamKey, StreamReport] = {}
    for key in sorted(set(sent_by) | set(applied_by)):
        streams[key] = _check_stream(key, sent_by.get(key, {}), applied_by.get(key, []), snaps)

    gone = set(rolled_back)
    leaked = sorted(
        {a.payload_id for rows in applied_by.values() for a in rows if a.payload_id in gone}
    )
    return Report(streams, leaked)


def _check_stream(
    key: StreamKey,
    sent: Mapping[int, str],
    rows: list[AppliedEntry],
    snaps: Mapping[str, SnapshotInfo],
) -> StreamReport:
    report = StreamReport(key, expected=len(sent))
    rows = sorted(rows, key=lambda a: a.order)
    logs = [a for a in rows if a.kind == LOG]
    report.applied = len(logs)

    # Snapshots: completed ones (an end applied after a start of the same id) and their spans.
    spans: list[tuple[int, int, int]] = []  # (start order, end order, base position)
    started: dict[str, int] = {}
    for a in rows:
        if a.kind == START:
            started[a.snapshot_id] = a.order
        elif a.kind == END:
            if a.snapshot_id not in started:
                report.snapshot_problems.append(f"end of {a.snapshot_id} without a start")
                continue
            info = snaps.get(a.snapshot_id)
            if info is None:
                report.snapshot_problems.append(
                    f"completed snapshot {a.snapshot_id} unknown at the source"
                )
                continue
            spans.append((started.pop(a.snapshot_id), a.order, info.base_position))
            _check_snapshot(report, a.snapshot_id, info, rows)
    report.snapshots_completed = len(spans)

    # Log entries, epoch by epoch: a completed snapshot (base B) starts a new epoch whose
    # entries must be above B; those above B may repeat ones of earlier epochs (replay).
    epoch_of = [sum(1 for _, end, _ in spans if end < a.order) for a in logs]
    seen: set[int] = set()
    last = 0  # the highest position applied (keyed or not)
    barrier = 0  # the highest position applied without a key, or the snapshot base
    by_key: dict[str, int] = {}  # the highest position applied per key
    epoch = 0
    for a, e in zip(logs, epoch_of, strict=True):
        if e != epoch:
            epoch, seen, last = e, set(), spans[e - 1][2]
            barrier, by_key = last, {}
        if any(start < a.order < end for start, end, _ in spans):
            report.out_of_order.append((-1, a.position))  # inside a snapshot
        if a.position in seen:
            report.duplicated.append(a.position)
            continue
        seen.add(a.position)
        floor = max(barrier, by_key.get(a.key, 0)) if a.key else last
        if a.position <= floor:
            report.out_of_order.append((floor, a.position))
        last = max(last, a.position)
        if a.key:
            by_key[a.key] = max(by_key.get(a.key, 0), a.position)
        else:
            barrier = max(barrier, a.position)
        want = sent.get(a.position)
        if want is None:
            report.unexpected.append(a.position)
        elif a.payload_id != want:
            report.corrupt.append(a.position)
    # After the last completed snapshot (base B) every entry above B must have been applied;
    # entries at or below B are covered by it (whether or not they arrived before it).
    base = spans[-1][2] if spans else 0
    if epoch != len(spans):  # no log entry after the last snapshot
        seen = set()
    report.covered = sum(1 for p in sent if p <= base)
    report.lost = [p for p in sorted(sent) if p > base and p not in seen]
    return report


def _check_snapshot(
    report: StreamReport, sid: str, info: SnapshotInfo, rows: list[AppliedEntry]
) -> None:
    ordinals = [a.position for a in rows if a.kind == SNAPSHOT and a.snapshot_id == sid]
    report.snapshot_entries += len(ordinals)
    counts = Counter(ordinals)
    dups = sorted(p for p, n in counts.items() if n > 1)
    if dups:
        report.snapshot_problems.append(f"snapshot {sid}: entries applied twice {dups[:8]}")
    if any(b <= a for a, b in itertools.pairwise(ordinals)):
        report.snapshot_problems.append(f"snapshot {sid}: entries out of order")
    n = info.entry_count if info.entry_count is not None else max(ordinals, default=0)
    missing = sorted(set(range(1, n + 1)) - set(ordinals))
    if missing:
        report.snapshot_problems.append(
            f"snapshot {sid}: {len(missing)} of {n} entries lost {missing[:8]}"
        )
    extra = sorted(set(ordinals) - set(range(1, n + 1)))
    if extra:
        report.snapshot_problems.append(f"snapshot {sid}: entries beyond its count {extra[:8]}")


__all__ = [
    "END",
    "LOG",
    "SNAPSHOT",
    "START",
    "AppliedEntry",
    "Report",
    "SentEntry",
    "SnapshotInfo",
    "StreamReport",
    "verify",
]
