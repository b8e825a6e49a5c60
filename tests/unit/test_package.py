"""Packaging rules: the public API, the import boundaries, generated code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lr_client
from lr_client import records
from lr_client._proto import replication_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def test_all_is_what_is_exported() -> None:
    import types

    public = {
        n
        for n, v in vars(lr_client).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType) and n != "annotations"
    }
    assert set(lr_client.__all__) - {"__version__"} == public


def test_client_imports_neither_grpc_nor_pyspark() -> None:
    code = (
        "import sys, lr_client, lr_client.store;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'pyspark')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_sqlite_server_imports_no_migrations_orm_postgres_driver_or_spark_launcher() -> None:
    """What every `lr server` and subscriber process would pay for at start without
    using it: Alembic (only to migrate), the ORM (only to call a listener), psycopg
    (only for PostgreSQL) and the Spark launcher (only for a snapshot)."""
    code = (
        "import sys; import lr_client, lr_server.server, lr_server.cli.serve;"
        "from lr_client.store import open_store;"
        "open_store('sqlite://');"
        "tops = ('alembic', 'mako', 'psycopg', 'spark_jobs');"
        "bad = sorted({m for m in sys.modules if m.split('.')[0] in tops"
        " or m.startswith('sqlalchemy.orm')});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_only_spark_jobs_imports_pyspark() -> None:
    """No module of lr_client or lr_server imports pyspark, not even inside a function."""
    import ast

    found = []
    for path in sorted([*ROOT.glob("lr_client/**/*.py"), *ROOT.glob("lr_server/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "pyspark" for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_generated_code_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_enums_match_the_protocol() -> None:
    for member in records.ReplicationType:
        assert pb.ReplicationType.Value(member.name) == member.value
