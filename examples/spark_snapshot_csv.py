"""A full sync from a CSV file, written by the PySpark snapshot job into a SQLite site database.

    python examples/spark_snapshot_csv.py [--csv policies.csv] [--database site-a.db]
                                          [--master local[2]]

Without ``--csv`` it writes a small sample file first. The script records a
snapshot request of client ``policy`` for destination ``site-b`` (what the
sender session does when ``site-b`` needs a full sync), runs the job (one JSON
entry per CSV row, written from the Spark executors), and prints the entry
count from the end marker. An ``lr server`` of the site would then ship the
snapshot to ``site-b``. The same from the command line::

    python -m spark_jobs.snapshot_job --database-url sqlite:///site-a.db \\
        --destination site-b --client policy --source csv:policies.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
from pathlib import Path

from lr_client import create_engine, open_store
from lr_client.records import ReplicationType
from spark_jobs import load_dataframe, parse_source, run_snapshot_job
from spark_jobs.snapshot_job import build_session


def write_sample(path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["policy_id", "holder", "premium"])
        for i in range(1, 101):
            out.writerow([i, f"holder {i}", f"{100 + i}.00"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--csv", type=Path, help="CSV file with a header line")
    parser.add_argument("--database", type=Path, help="SQLite file of the source site")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lr-example-"))
    csv_path = args.csv or work / "policies.csv"
    if args.csv is None:
        write_sample(csv_path)
    url = f"sqlite:///{args.database or work / 'site-a.db'}"

    store = open_store(create_engine(url))
    store.create_schema()
    snapshot_id = store.snapshots.request_snapshot(None, "site-b", "policy", "example")

    # Local Spark runs its Python workers with this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_session(args.master, {"spark.ui.enabled": "false"}, "lr-example")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = load_dataframe(spark, parse_source(f"csv:{csv_path}"))
        count = run_snapshot_job(spark, url, snapshot_id, df, start=True)
    finally:
        spark.stop()

    entries = store.snapshot_entries.read_snapshot_entries(snapshot_id, 0, 3)
    end = store.snapshot_entries.read_snapshot_entries(snapshot_id, count, 1)
    assert end and end[0].type == ReplicationType.LAST_FULL_SYNC_ENTRY
    print(f"snapshot {snapshot_id} for site-b: {count} entries")
    for entry in entries:
        print("  ", entry.payload.decode())
    print(f"end marker: {end[0].payload.decode()} entries")
    store.close()
    shutil.rmtree(work)  # the sample file and default database, if we made them
    return 0


if __name__ == "__main__":
    sys.exit(main())
