"""The Spark side of ``lr demo``: whether a Spark job can run here, and the job's source.

``lr demo`` (``lr_server/demo/``) calls :func:`spark_available` before it
chooses how site ``d`` gets its full sync; when it is a Spark job, the
client's ``spark_source`` is :func:`catalog_frame`. Importing this module
does not import pyspark.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The environment variable that holds the path of site a's SQLite database.
SOURCE_DB_ENV = "LR_DEMO_SOURCE_DB"

#: ``spark_source`` of the demo's catalog client: :func:`catalog_frame`.
CATALOG_SOURCE = "spark_jobs.demo:catalog_frame"

#: How to get the ``spark`` extra: from a release, or from a checkout of the source.
SPARK_EXTRA_HINT = "'lr-routing-queue[spark]', or -e '.[spark]' in a checkout"


def catalog_frame(spark: SparkSession) -> DataFrame:
    """The Spark job's source: the catalog table of site a (path in $LR_DEMO_SOURCE_DB)."""
    with sqlite3.connect(os.environ[SOURCE_DB_ENV]) as conn:
        found = conn.execute("SELECT key, value FROM demo_catalog ORDER BY key").fetchall()
    return spark.createDataFrame(found, "key string, value long")


def spark_available() -> tuple[bool, str]:
    """Whether a Spark job can run here (Java on PATH, PySpark importable), and if not, why."""
    if shutil.which("java") is None:
        return False, "Java was not found on PATH"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False, f"PySpark is not installed (pip install {SPARK_EXTRA_HINT})"
    return True, ""
