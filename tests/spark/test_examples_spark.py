"""The Spark example runs as a newcomer would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.wait import scaled
from tests.spark.conftest import require_spark

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_spark_snapshot_csv_example(tmp_path: Path) -> None:
    require_spark()
    data = tmp_path / "policies.csv"
    data.write_text('policy_id,holder\n1,ann\n2,bob\n3,"cy, jr"\n')
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "spark_snapshot_csv.py"),
            "--csv",
            str(data),
            "--database",
            str(tmp_path / "site-a.db"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ": 3 entries" in done.stdout
    assert "end marker: 3 entries" in done.stdout
    assert '"holder":"cy, jr"' in done.stdout
