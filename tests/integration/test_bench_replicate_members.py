"""``bench/replicate.py --members``'s JSON and report, from measured cells; its checks.

The benchmark runs real ``lr server`` processes on PostgreSQL (two sinks; a source of
one, then two members, the second run with a kill -9); this test feeds the code that
turns its cells into its JSON and its report with known cells of the shapes it measures,
in this process. The benchmarks' wiring with real servers is proven by
tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.common import machine_facts, write_json
from bench.replicate import Latency, parse_args
from bench.replicate_members import DbLoad, Failover, MembersCell, members_result, report


def cell(members: int, failover: Failover | None) -> MembersCell:
    streams = {f"m-{i}": 0 for i in range(1, members + 1)}
    for d in range(2):  # two streams and the trim job
        streams[f"m-{d % members + 1}"] += 1
    db = DbLoad(1.5, {m: 2 for m in streams}, 2.0 * members, 4.0, 3.0, 1.0)
    return MembersCell(
        members, 2, 3, streams, 0.4, 200, True, 1500.0, 100.0, 98.0, True,
        Latency(48, 3.0, 9.0, 12.0), {"sink-1": 9.0, "sink-2": 8.5}, 0.8, db, failover,
        [0.5, 0.4, 0.3],
    )  # fmt: skip


def test_members_benchmark_writes_a_cell_per_member_count(tmp_path: Path) -> None:
    out = tmp_path / "members.json"
    args = parse_args(
        ["--members", "1,2", "--seconds", "0.5", "--entries", "200", "--rate", "100",
         "--destinations", "2", "--out", str(out)]
    )  # fmt: skip
    fo = Failover("m-2", 1, 5.3, 5.6, 5.9, complete=True)
    late = Failover("m-1", 2, 5.3, 5.6, 6.4, complete=True)
    cells = [cell(1, None), cell(2, fo)]
    write_json(out, members_result(args, cells, machine_facts(), {"backend": "pg"}, 9.87))
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "replicate-members" and data["elapsed_seconds"] == 9.9
    assert data["settings"]["members"] == [1, 2]
    assert data["settings"]["lease_timeout"] == 5.0  # the default
    assert data["settings"]["failover_target_s"] == 6.0
    assert data["settings"]["entries_per_destination"] == 200
    assert data["settings"]["offered_rate"] == 100 and data["settings"]["destinations"] == 2
    assert len(data["machine"]["loadavg_at_start"]) == 3 and len(data["loadavg_at_end"]) == 3
    assert data["backend_facts"] == {"backend": "pg"}
    got = data["results"]
    assert [c["members"] for c in got] == [1, 2]
    for c in got:
        assert c["units"] == 3
        assert sorted(c["streams_per_member"]) == [f"m-{i}" for i in range(1, c["members"] + 1)]
        assert sum(c["streams_per_member"].values()) == 2
        assert c["drain_complete"] and c["aggregate_rate"] == 1500.0
        assert c["pooled"] == {"entries": 48, "p50_ms": 3.0, "p99_ms": 9.0, "max_ms": 12.0}
        assert set(c["per_destination_p99_ms"]) == {"sink-1", "sink-2"}
        assert sorted(c["db"]["connections_max"]) == sorted(c["streams_per_member"])
    assert got[0]["failover"] is None  # nobody to fail over to
    f = got[1]["failover"]
    assert f["victim"] == "m-2" and f["victim_streams"] == 1 and f["complete"]
    assert (f["units_owned_after_s"], f["first_delivery_s"], f["all_resumed_s"]) == (5.3, 5.6, 5.9)
    assert f["met"] is True and f["target_s"] == 6.0 and f["lease_timeout_s"] == 5.0
    # Met is all resumed within the target; a failover that never resumed did not meet it.
    assert not late.met and not Failover("m-1", 1, 5.3, None, None).met

    console = Console(record=True, width=220)
    report(console, [cell(1, None), cell(2, fo), cell(2, late)])
    shown = console.export_text()
    assert "Source site of N members, 2 destinations" in shown
    assert "m-2 (1)" in shown and "m-1 (2)" in shown
    assert "yes" in shown and "NO" in shown


def test_members_counts_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # The argument checks of bench/replicate.py's own entry point, called in this process.
    from bench.replicate import main

    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
        assert exit_.value.code == 2
        return capsys.readouterr().err

    for bad in ("0", "4", "1,x"):
        err = refused("--members", bad)
        assert "--members" in err, err
    err = refused("--members", "2", "--backend", "sqlite")
    assert "PostgreSQL" in err, err
