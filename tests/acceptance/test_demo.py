"""The README's first command: `lr demo` replicates four sites and checks every sink."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled

# The smallest run that still shows every part: --duration's minimum is 1 s, and the
# application writes on past --transactions until d's full sync (star) or the provider
# switch (tree) is done, so neither part is cut short by a small count.
TRANSACTIONS = "40"
DURATION = "1"


def _demo(env: dict[str, str]) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lr_server.cli",
            "demo",
            "--transactions",
            TRANSACTIONS,
            "--duration",
            DURATION,
        ],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "80"},
        cwd=ROOT,
        timeout=scaled(300),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "All sinks match their source." in out
    table = [line for line in out.splitlines() if line.startswith(("│", "┃"))]
    assert len(table) >= 4  # header + b, c, d
    assert all(len(line) <= 80 for line in out.splitlines()), "demo output wider than 80 columns"
    return out


def test_demo_runs_and_every_sink_matches() -> None:
    out = _demo(lr_env())
    assert "Full sync of d by PySpark job" in out or "Spark full sync skipped" in out


def test_demo_without_java_says_so_and_runs_the_rest(tmp_path: Path) -> None:
    # A PATH with this interpreter but no java on it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {**lr_env(), "PATH": str(bin_dir)}
    env.pop("JAVA_HOME", None)
    assert not any(os.access(Path(p) / "java", os.X_OK) for p in env["PATH"].split(os.pathsep))
    out = _demo(env)
    assert "Spark full sync skipped: Java was not found" in out
    assert "Full sync of d by in-process provider" in out


def test_demo_tree_relays_to_every_node_and_switches_a_leaf_without_full_sync() -> None:
    """`lr demo --topology tree`: a -> b -> c, d; d moved to a mid-run by `lr provider
    switch`; every node ends with the root's rows and no node needed a full sync."""
    args = ["demo", "--topology", "tree", "--transactions", TRANSACTIONS, "--duration", DURATION]
    done = subprocess.run(
        [sys.executable, "-m", "lr_server.cli", *args],
        capture_output=True,
        text=True,
        env={**lr_env(), "COLUMNS": "80"},
        cwd=ROOT,
        timeout=scaled(300),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Every node holds what the root transmitted." in out
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    # node: role, provider, applied, rows, full syncs, check
    role, provider, applied, rows_a, syncs, sent = rows["a"]
    assert (role, provider, applied, syncs) == ("root", "-", "-", "-")
    sent = sent.removesuffix(" sent")
    assert int(sent) >= int(TRANSACTIONS)  # the application writes on until the switch is done
    assert rows["b"][0:2] == ["branch", "a (epoch 1)"]
    assert rows["c"][0:2] == ["leaf", "b (epoch 1)"]
    assert rows["d"][0:2] == ["leaf", "a (epoch 2)"]
    for node in "bcd":
        assert rows[node][2:] == [sent, rows_a, "0", f"{rows_a} rows ok"], (node, out)
    assert "b was refused and let it go." in out
    assert all(len(line) <= 80 for line in out.splitlines()), "demo output wider than 80 columns"
