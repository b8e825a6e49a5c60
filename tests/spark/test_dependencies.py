"""The ``spark`` extra's pins: PySpark starts without a warning about its dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.conftest import require_spark

ROOT = Path(__file__).resolve().parents[2]

#: Imports the job and runs PySpark's own checks of pandas and pyarrow (what a pandas
#: UDF or ``mapInArrow`` runs), starting no JVM.
_CODE = """
import spark_jobs.snapshot_job, spark_jobs.writer, spark_jobs.encoders, spark_jobs.sources
import pyspark.sql
from pyspark.sql.pandas.utils import (
    require_minimum_pandas_version, require_minimum_pyarrow_version,
)
require_minimum_pandas_version()
require_minimum_pyarrow_version()
import pandas, pyarrow
print(pandas.__version__, pyarrow.__version__)
"""


@pytest.mark.spark
def test_the_job_imports_without_any_warning() -> None:
    """Fails on any warning, e.g. PySpark's about a pandas newer than it supports."""
    require_spark()
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _CODE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]


def test_the_installed_versions_are_those_of_the_spark_extra() -> None:
    """What ``scripts/_env.sh`` installs (``.[dev,spark]``) is what ``setup.cfg`` pins."""
    import configparser
    from importlib.metadata import version

    from packaging.requirements import Requirement

    require_spark()
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.extras_require"]["spark"].split("\n")
    extra = [Requirement(line) for line in lines if line]
    assert {r.name for r in extra} >= {"pyspark", "pandas", "pyarrow"}
    for req in extra:
        assert req.specifier.contains(version(req.name)), f"{req.name} {version(req.name)}: {req}"
    pandas = next(r for r in extra if r.name == "pandas")
    assert not pandas.specifier.contains("3.0.0"), "PySpark warns about pandas >= 3"
    assert "'.[dev,spark]'" in (ROOT / "scripts" / "_env.sh").read_text()
