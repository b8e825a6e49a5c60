"""Mutation testing of the code that holds the invariants (run it as ``scripts/mutate``).

Each *target* names the functions to mutate and the fast deterministic tests
(SQLite and PostgreSQL) that must kill their mutants. For each target a copy of
the sources and tests is made in ``.mutate/<target>/`` with mutmut's settings
for it, mutmut runs there (the work tree is never modified), and the result is
summed up: mutants killed, survived, not covered by any test of the pool, timed
out. Survivors are printed as diffs and kept in ``.mutate/<target>/survivors.txt``.

    scripts/mutate names trim          # some targets
    scripts/mutate --list              # the targets, their code and tests
    scripts/mutate receive --jobs 1    # one mutant at a time (the default)
    scripts/mutate trim --survivors    # only the last run's survivors, after adding tests
    scripts/mutate session --only 'lr_server.sending.acks.*'   # some of its functions

PostgreSQL tests need the server of ``LR_TEST_PG_URL`` (``CI=true`` is set, so
an unreachable server fails instead of skipping). docs/reliability.md records
the scores and explains every survivor.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutate"
COPY = ["lr_client", "lr_server", "tests", "setup.cfg", "pyproject.toml"]

BASE = "lr_client.store.core.xǁStoreCoreǁ"
SEND_LOG = "lr_client.store.send.log.xǁSendLogStoreǁ"
SHIPPING = "lr_client.store.send.shipping.xǁShippingStoreǁ"
REQUESTS = "lr_client.store.snapshots.requests.xǁSnapshotRequestsStoreǁ"
LIFECYCLE = "lr_client.store.snapshots.lifecycle.xǁSnapshotLifecycleStoreǁ"
SNAPSHOTS = "lr_client.store.snapshots.entries.xǁSnapshotEntriesStoreǁ"
RETENTION = "lr_client.store.retention.store.xǁRetentionStoreǁ"
RECEIVING = "lr_client.store.recv.receiving.xǁReceivingStoreǁ"
SINK_STATE = "lr_client.store.recv.sink_state.xǁSinkStateStoreǁ"
SQLITE = "lr_client.store.sqlite.xǁSQLiteCoreǁ"
PG = "lr_client.store.postgres.xǁPostgresCoreǁ"
SESSION = "lr_server.sending.session.xǁSenderSessionǁ"
RESUMER = "lr_server.sending.resume.xǁResumerǁ"
ACKS = "lr_server.sending.acks.xǁAcknowledgementsǁ"
STORE_FILES = [
    "lr_client/store/core.py",
    "lr_client/store/byte_bounds.py",
    "lr_client/store/send/log.py",
    "lr_client/store/send/shipping.py",
    "lr_client/store/snapshots/requests.py",
    "lr_client/store/snapshots/lifecycle.py",
    "lr_client/store/snapshots/views.py",
    "lr_client/store/snapshots/entries.py",
    "lr_client/store/retention/store.py",
    "lr_client/store/recv/receiving.py",
    "lr_client/store/recv/sink_state.py",
    "lr_client/store/sqlite.py",
    "lr_client/store/postgres.py",
    "lr_client/store/send/sequencer.py",
    "lr_client/store/retention/slots.py",
    "lr_client/store/slot_ring.py",
]
#: The store contract suite, one module per role. mutmut wants every selected test
#: green on the unmutated code; the checks of a store on an empty database reach no
#: mutated function and are left out.
CONTRACT = ["tests/contract"]
#: The commit-order tests of ``send``, but the SQLite run of the think-time writers
#: (SQLite has one writer: 12 s of lock waits a run, and no sequencer to test).
_ORDER = "tests/integration/test_commit_order.py::"
COMMIT_ORDER = [
    _ORDER + "test_out_of_order_commits_are_never_skipped",
    _ORDER + "test_many_concurrent_writers_never_skip",
    _ORDER
    + "test_writers_with_rollbacks_and_think_times_are_read_once_in_commit_order[postgresql-sync]",
    _ORDER + "test_an_idle_transaction_does_not_hold_back_delivery",
    _ORDER + "test_transactions_that_conflict_on_a_row_are_delivered_in_commit_order",
    _ORDER + "test_savepoints_keep_a_transactions_entries_dense_and_in_order",
    _ORDER + "test_any_interleaving_reads_each_committed_entry_once_in_commit_order",
    _ORDER + "test_transaction_ids_that_went_back_do_not_stop_sequencing",
    _ORDER + "test_a_search_path_changed_before_commit_still_stamps_the_queue",
]


#: The receiver's tests of what it learnt after the first runs (headers and codecs of
#: entries, replays, relays and their lag, bounded receive queues, negotiation).
RECEIVER_FEATURES = [
    "tests/unit/test_receiver_calls.py",
    "tests/unit/test_receiver_entries.py",
    "tests/unit/test_replicate_handler.py",
    "tests/integration/test_replay.py",
    "tests/integration/test_relay_lag_metric.py",
    "tests/integration/test_negotiation.py",
    "tests/integration/test_receive_queue_limits.py",
    "tests/integration/test_cascade.py",
]


@dataclass(frozen=True)
class Target:
    """Functions to mutate (mutmut names, globs allowed) and the tests that must kill them."""

    files: list[str]
    mutants: list[str]
    tests: list[str]
    about: str
    env: tuple[tuple[str, str], ...] = ()


def _methods(prefix: str, *names: str) -> list[str]:
    return [f"{prefix}{n}__mutmut_*" for n in names]


TARGETS: dict[str, Target] = {
    "names": Target(
        ["lr_client/names.py"],
        ["lr_client.names.*"],
        ["tests/unit/test_names.py"],
        "name validation and receive-queue names",
    ),
    "trim": Target(
        STORE_FILES,
        [
            *_methods(
                RETENTION, "trim", "acked_positions", "drop_stream", "list_drops", "clear_drop"
            ),
            *_methods(SQLITE, "trim_send_log", "_trim_log", "_trim_client"),
            *_methods(PG, "trim_send_log"),
            "lr_client.store.retention.slots.*",
            "lr_client.store.slot_ring.*",
        ],
        [
            "tests/integration/test_trim.py",
            "tests/integration/test_trim_property.py",
            "tests/integration/test_send_slots.py",
            "tests/unit/test_slot_ring.py",
            "tests/integration/test_slot_ring_tables.py",
            # The root of a cascaded client: its trim at the global watermark.
            "tests/integration/test_cascade_control.py",
            *CONTRACT,
        ],
        "trim watermark, open snapshot bases, drops, send queue slots",
        (("LR_TRIM_EXAMPLES", "25"),),
    ),
    "receive": Target(
        [*STORE_FILES, "lr_server/receiving/receiver.py"],
        [
            *_methods(RECEIVING, "apply_log_batch", "apply_snapshot_batch"),
            *_methods(
                SINK_STATE,
                "_save_progress",
                "_progress",
                "_progress_row",
                "locked_progress",
                "sink_progress",
                "ensure_queue",
                "append",
            ),
            *_methods(SQLITE, "append_recv"),
            *_methods(PG, "append_recv", "lock_stream"),
            "lr_server.receiving.receiver.*",
        ],
        [
            *CONTRACT,
            "tests/integration/test_sink_exactly_once.py",
            "tests/integration/test_receiver_checks.py",
            *RECEIVER_FEATURES,
        ],
        "the sink receiver: batch checks, duplicates, snapshot supersession, drop notices",
    ),
    "receiver": Target(
        ["lr_server/receiving/receiver.py"],
        ["lr_server.receiving.receiver.*"],
        [
            "tests/integration/test_sink_exactly_once.py",
            "tests/integration/test_receiver_checks.py",
            *RECEIVER_FEATURES,
        ],
        "the receiver's checks of batches from the wire (a quick subset of 'receive')",
    ),
    "snapshot": Target(
        STORE_FILES,
        [
            *_methods(REQUESTS, "request_snapshot", "_request_snapshot"),
            *_methods(
                LIFECYCLE,
                "start_snapshot",
                "_cancel",
                "cancel_snapshot",
                "complete_snapshot",
                "fail_stalled_snapshot",
                "heartbeat_snapshot",
                "change_snapshot",
            ),
            *_methods(
                SNAPSHOTS,
                "finish_snapshot",
                "read_snapshot_entries",
                "_require_writable",
                "write_snapshot_entries",
            ),
        ],
        [
            *CONTRACT,
            "tests/integration/test_snapshot_provider.py",
            # Slots, and the row locks that let heartbeats through while chunks are written.
            "tests/integration/test_snapshot_pool.py",
            "tests/integration/test_trim.py",
            "tests/integration/test_bounded_reads.py",
        ],
        "the source's snapshot requests and snapshot queue",
    ),
    "send": Target(
        [*STORE_FILES, "lr_client/sender.py"],
        [
            *_methods(SEND_LOG, "append_log_entries", "positions_of"),
            *_methods(SHIPPING, "read_log_entries", "read_client_log", "backlog"),
            *_methods(SHIPPING, "get_cursor", "set_cursor", "oldest_position"),
            *_methods(BASE, "write_cursor"),
            "lr_client.store.byte_bounds.x_within__mutmut_*",
            "lr_client.store.byte_bounds.xǁByteCutǁtake__mutmut_*",
            *_methods(SQLITE, "insert_entries", "with_tag", "tagged_query", "head_position"),
            "lr_client.store.sqlite.x__names*",
            *_methods(
                PG,
                "insert_entries",
                "tagged_query",
                "with_tag",
                "head_position",
                "sequence",
                "txn_bases",
            ),
            "lr_client.store.send.sequencer.*",
        ],
        [
            "tests/contract/test_send_log.py",
            "tests/contract/test_shipping.py",
            "tests/integration/test_sender.py",
            *COMMIT_ORDER,
            "tests/integration/test_sequencer.py",
            "tests/integration/test_store_backends.py",
            "tests/integration/test_trim.py",
            "tests/integration/test_bounded_reads.py::test_a_destinations_reads_load_only_what_fits",
            "tests/integration/test_bounded_reads.py::test_the_shared_readers_reads_load_only_what_fits",
            "tests/unit/test_byte_cut.py",
            "tests/contract/test_members.py::test_a_cursor_moves_only_under_the_current_fence",
            "tests/integration/test_query_plans.py",
        ],
        "transmit, tagged reads, cursors, the commit-order sequencer",
        (("LR_COMMIT_ORDER_EXAMPLES", "20"),),
    ),
    "subscriber": Target(
        [
            "lr_client/delivery.py",
            "lr_client/subscriber.py",
            "lr_client/partition_workers.py",
            "lr_client/listener_calls.py",
            "lr_client/queue_leases.py",
        ],
        [
            "lr_client.delivery.*",
            "lr_client.subscriber.*",
            "lr_client.partition_workers.*",
            "lr_client.listener_calls.*",
            "lr_client.queue_leases.*",
        ],
        [
            "tests/unit/test_delivery_plan.py",
            "tests/integration/test_subscriber.py",
            "tests/integration/test_sink_exactly_once.py",
            "tests/integration/test_bounded_reads.py",
            "tests/integration/test_listener_base_position.py",
            "tests/integration/test_parking.py",
            "tests/integration/test_partitioned_delivery.py",
            "tests/integration/test_subscriber_threads.py",
            "tests/integration/test_partition_workers.py",
            "tests/acceptance/test_tracing.py::"
            "test_a_listener_applies_a_batch_in_a_span_linked_to_each_traced_entry",
        ],
        "delivery plans (snapshot filter), exactly-once delivery, leases, listener calls",
    ),
    "session": Target(
        [
            "lr_server/sending/negotiation.py",
            "lr_server/sending/window.py",
            "lr_server/sending/snapshot_requests.py",
            "lr_server/sending/session.py",
            "lr_server/sending/resume.py",
            "lr_server/sending/acks.py",
        ],
        [
            "lr_server.sending.negotiation.*",
            "lr_server.sending.window.*",
            "lr_server.sending.snapshot_requests.*",
            *_methods(SESSION, "_plan"),
            *_methods(RESUMER, "plan", "_apply"),
            *_methods(ACKS, "on_ack", "flush_cursors"),
        ],
        [
            "tests/unit/test_negotiation.py",
            "tests/unit/test_window.py",
            "tests/integration/test_snapshot_requests.py",
            "tests/integration/test_session_steps.py",
        ],
        "negotiation plans, the in-flight window, snapshot requests, acknowledgements "
        "(unit tables; the session's steps and requests on a store, without a transport)",
    ),
    "lanes": Target(
        ["lr_client/lanes.py", "lr_server/transport/lanes.py", "lr_server/sending/streams.py"],
        ["lr_client.lanes.*", "lr_server.transport.lanes.*", "lr_server.sending.streams.*"],
        [
            "tests/unit/test_window.py",
            "tests/unit/test_lane_streams.py",
            "tests/contract/test_receiving.py",
            "tests/integration/test_lanes.py",
        ],
        "a stream over several lanes: the lane of a key, the streams behind the seam, "
        "the contiguous acknowledgement (the sink's checks, real gRPC on loopback)",
    ),
}

STATUS = re.compile(r"^\s*(\S+): (.+)$")


def prepare(name: str, target: Target) -> Path:
    """A fresh copy of the sources and tests, configured for ``target``."""
    work = WORK / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.db", "*.db-*")
    for item in COPY:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, work / item, ignore=skip)
        else:
            shutil.copy2(src, work / item)
    config = [
        "",
        "[tool.mutmut]",
        'source_paths = ["lr_client", "lr_server"]',
        f"only_mutate = {target.files!r}",
        f"pytest_add_cli_args_test_selection = {target.tests!r}",
        'pytest_add_cli_args = ["-p", "no:randomly", "-q", "-x"]',
        'process_isolation = "forkserver"',
        "use_git_change_detection = false",
        "",
    ]
    with (work / "pyproject.toml").open("a") as f:
        f.write("\n".join(config).replace("'", '"'))
    return work


def results(work: Path, mutmut: str, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [mutmut, "results", "--all", "true"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = STATUS.match(line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def last_survivors(name: str) -> list[str]:
    """The mutants that survived the last run of target ``name`` (its survivors.txt)."""
    path = WORK / name / "survivors.txt"
    if not path.exists():
        raise SystemExit(f"no earlier run of {name}: run it whole first")
    return [m.group(1) for m in re.finditer(r"^## (\S+): ", path.read_text(), re.MULTILINE)]


def run(
    name: str,
    target: Target,
    jobs: int,
    report_only: bool = False,
    survivors: bool = False,
    only: list[str] | None = None,
) -> dict[str, int]:
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "CI": "true", "LR_TEST_ORDER": "fastest-first", **dict(target.env)}
    env.pop("PYTHONPATH", None)
    print(f"== {name}: {target.about}", flush=True)
    work = WORK / name
    started = time.monotonic()
    if only:
        # Some functions of the target only (mutmut names, globs allowed).
        target = Target(target.files, only, target.tests, target.about, target.env)
        print(f"   only: {', '.join(only)}", flush=True)
    if survivors:
        # Only the last run's survivors, against the tests as they are now.
        target = Target(target.files, last_survivors(name), target.tests, target.about, target.env)
        print(f"   again: the {len(target.mutants)} survivors of the last run", flush=True)
    if not report_only:
        work = prepare(name, target)
        proc = subprocess.run(
            [mutmut, "run", "--max-children", str(jobs), *target.mutants],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        (work / "mutmut.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"mutmut failed for {name} (exit {proc.returncode}); see {work}")
    seconds = time.monotonic() - started
    statuses = {
        k: v
        for k, v in results(work, mutmut, env).items()
        if any(fnmatch.fnmatchcase(k, pattern) for pattern in target.mutants)
    }
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    survivors = sorted(
        k for k, v in statuses.items() if v not in ("killed", "caught by type check")
    )
    with (work / "survivors.txt").open("w") as f:
        for mutant in survivors:
            diff = subprocess.run(
                [mutmut, "show", mutant], cwd=work, env=env, capture_output=True, text=True
            ).stdout
            f.write(f"## {mutant}: {statuses[mutant]}\n{diff}\n")
    killed = counts.get("killed", 0)
    total = len(statuses)
    score = 100.0 * killed / total if total else 0.0
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"   {total} mutants: {summary}; score {score:.1f}% in {seconds:.0f} s")
    for mutant in survivors:
        print(f"   {statuses[mutant]}: {mutant}")
    print(f"   diffs: {work / 'survivors.txt'}", flush=True)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"of: {', '.join(TARGETS)}; 'all' for every one")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (1)")
    parser.add_argument(
        "--report", action="store_true", help="summarise the last run of the targets again"
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="test only the mutants that survived the last run (after adding tests)",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="mutate only the functions whose mutmut names match (repeatable), e.g. "
        "'lr_server.sending.acks.*'",
    )
    args = parser.parse_args()
    if args.list or not args.targets:
        for name, t in TARGETS.items():
            print(f"{name}: {t.about}\n  code: {', '.join(t.files)}\n  tests: {', '.join(t.tests)}")
        return
    names = list(TARGETS) if args.targets == ["all"] else args.targets
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    for name in names:
        run(name, TARGETS[name], args.jobs, args.report, args.survivors, args.only)


if __name__ == "__main__":
    main()
