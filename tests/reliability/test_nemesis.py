"""The nemesis (:mod:`tests.reliability.nemesis`): combined faults, then the verifier.

CI runs one short run (one trial) per backend (``test_nemesis_trial``); the
long mode runs ``LR_NEMESIS_TRIALS`` trials in runs of ``LR_NEMESIS_RUN_TRIALS``
(default 10: a run is one deployment), alternating SQLite and PostgreSQL::

    LR_NEMESIS_TRIALS=200 nice -n 10 python -m pytest -s -n 0 \\
        tests/reliability/test_nemesis.py::test_nemesis_long

Each run prints its seed; ``LR_NEMESIS_SEED=<seed>`` replays it, with
``LR_NEMESIS_SCENARIO`` (``members`` or ``cascade``, default: the seed's
parity) and ``LR_NEMESIS_RUN_TRIALS`` as printed, in
``test_nemesis_trial[<backend>]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.guards import need
from tests.kit.pgcluster import PgCluster, pg_bindir
from tests.kit.verifier import Report
from tests.reliability.nemesis import (
    KINDS,
    Tally,
    draw_plan,
    each_run,
    nemesis_seed,
    nemesis_trials,
    run_plan,
    start_clusters,
)
from tests.reliability.nemesis_cascade import draw_cascade_plan, run_cascade_plan

pytestmark = pytest.mark.slow


def run_trials(default: int) -> int:
    """``LR_NEMESIS_RUN_TRIALS``: trials per run (one deployment)."""
    raw = os.environ.get("LR_NEMESIS_RUN_TRIALS", "").strip()
    return max(1, int(raw)) if raw else default


SCENARIOS = ("members", "cascade")


def run_scenario(
    scenario: str,
    seed: int,
    backend: str,
    trials: int,
    tmp: Path,
    clusters: dict[str, PgCluster],
    tally: Tally,
) -> Report:
    """One run of ``scenario``: the 2-member source and its sinks, or the cascade."""
    print(f"LR_NEMESIS_SCENARIO={scenario} LR_NEMESIS_RUN_TRIALS={trials}", flush=True)
    if scenario == "cascade":
        plan = draw_cascade_plan(seed, backend, trials)
        print(plan.describe(), flush=True)
        return run_cascade_plan(plan, tmp, clusters, tally)
    assert scenario == "members", scenario
    plan = draw_plan(seed, backend, trials)
    print(plan.describe(), flush=True)
    return run_plan(plan, tmp, clusters, tally)


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, PgCluster]]:
    """A PostgreSQL cluster per site of the nemesis (crashed and restarted by it), in
    directories of the system's temporary directory (pytest's are private to root)."""
    need(pg_bindir() is not None, "PostgreSQL binaries (initdb, pg_ctl) not installed")
    made = start_clusters()
    yield made
    for c in made.values():
        c.remove()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_nemesis_trial(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """One seeded run of combined faults, over the 2-member source and its sinks or over
    the cascade (the seed chooses); nothing lost, twice or out of order."""
    clusters = request.getfixturevalue("clusters") if backend == "postgresql" else {}
    seed = nemesis_seed()
    tally = Tally()
    scenario = os.environ.get("LR_NEMESIS_SCENARIO", "").strip() or SCENARIOS[seed % 2]
    report = run_scenario(scenario, seed, backend, run_trials(1), tmp_path, clusters, tally)
    print(tally.summary())
    assert report.clean
    assert report.applied > 0 and tally.faults.total() > 0


def test_nemesis_long(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``LR_NEMESIS_TRIALS`` trials, alternating the backends (skipped when unset)."""
    count = nemesis_trials()
    if count <= 0:
        pytest.skip("the long mode: set LR_NEMESIS_TRIALS")
    clusters = request.getfixturevalue("clusters")
    per_run = run_trials(10)
    seed_of = each_run(nemesis_seed(), 10 * count)
    tally = Tally()
    failed: list[str] = []  # a failed run is recorded and the next one runs
    try:
        n = -1
        while tally.trials + tally.failed < count:
            n += 1
            backend = ("sqlite", "postgresql")[n % 2]
            scenario = SCENARIOS[(n // 2) % 2]
            workdir = tmp_path / f"run{n}"
            workdir.mkdir()
            trials = min(per_run, count - tally.trials - tally.failed)
            try:
                run_scenario(scenario, seed_of(n), backend, trials, workdir, clusters, tally)
            except Exception as exc:
                tally.failed += 1
                first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                failed.append(
                    f"LR_NEMESIS_SEED={seed_of(n)} LR_NEMESIS_SCENARIO={scenario}"
                    f" LR_NEMESIS_RUN_TRIALS={trials} [{backend}]: {type(exc).__name__}: {first}"
                )
                print(f"FAILED RUN {failed[-1]}", flush=True)
            print(f"after run {n + 1}: {tally.summary()}", flush=True)
    finally:
        print(f"\nnemesis long mode: {tally.summary()}")
        print("\n".join(["failed runs:", *failed] if failed else ["failed runs: none"]))
    assert not failed, failed
    assert tally.trials == count
    assert sum(tally.problems.values()) == 0


def test_a_seed_replays_the_same_schedules() -> None:
    """The replay promise: a run's shape and schedules are a function of its seed (and
    backend), every kind of fault is drawn, and the PostgreSQL-only ones only there."""
    for backend in ("sqlite", "postgresql"):
        assert draw_plan(7, backend, 3) == draw_plan(7, backend, 3)
        assert draw_cascade_plan(7, backend, 3) == draw_cascade_plan(7, backend, 3)
    assert draw_plan(7, "sqlite", 3) != draw_plan(8, "sqlite", 3)
    kinds = {
        backend: {
            f.kind
            for seed in range(40)
            for plan in (draw_plan(seed, backend), draw_cascade_plan(seed, backend))
            for faults in plan.schedules
            for f in faults
        }
        for backend in ("sqlite", "postgresql")
    }
    assert kinds["postgresql"] == {*KINDS, "switch"}
    assert kinds["sqlite"] == {*KINDS, "switch"} - {"db-net", "db-crash"}
