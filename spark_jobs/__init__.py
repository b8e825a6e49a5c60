"""PySpark snapshot-sync jobs (the ``spark`` extra).

:func:`run_snapshot_job` writes a DataFrame as one snapshot's entries from
the executors; :func:`launch_snapshot_job` starts the job in a child process
(what ``lr server`` does); ``python -m spark_jobs.snapshot_job`` and
``spark-submit spark_jobs/snapshot_job.py`` are its command line. Importing
this package does not import pyspark.
"""

from __future__ import annotations

from spark_jobs.driver import run_snapshot_job
from spark_jobs.encoders import json_encoder, load_encoder
from spark_jobs.launch import launch_snapshot_job, snapshot_job_command
from spark_jobs.sources import SourceSpec, load_dataframe, parse_source

__all__ = [
    "SourceSpec",
    "json_encoder",
    "launch_snapshot_job",
    "load_dataframe",
    "load_encoder",
    "parse_source",
    "run_snapshot_job",
    "snapshot_job_command",
]
