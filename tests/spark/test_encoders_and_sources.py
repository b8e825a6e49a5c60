"""Encoders and source specs, without a SparkSession."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lr_client.errors import ConfigError
from spark_jobs.encoders import arrow_json, encode_json_dict, load_encoder
from spark_jobs.sources import load_callable, parse_source
from tests.kit.guards import need

try:
    import pyarrow as pa
except ImportError:  # pragma: no cover - pyarrow comes with the spark extra
    pa = None


@pytest.fixture(autouse=True, scope="module")
def _pyarrow() -> None:
    need(pa is not None, "pyarrow is not installed (pip install -e '.[spark]')")


_text = st.one_of(st.none(), st.text(max_size=12))
_rows = st.lists(
    st.tuples(
        _text,
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        st.one_of(st.none(), st.booleans()),
        _text,
    ),
    min_size=1,
    max_size=20,
)
_SCHEMA = [("s", "string"), ("i", "int64"), ("b", "bool_"), ('k"é\\y', "large_string")]


@settings(max_examples=300, deadline=None)
@given(_rows)
def test_arrow_json_is_the_default_encoding(rows: list[tuple[Any, ...]]) -> None:
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in _SCHEMA])
    names = schema.names
    batch = pa.RecordBatch.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema)
    want = [encode_json_dict(dict(zip(names, r, strict=True))) for r in rows]
    got = arrow_json(batch, names)
    has_control = any(isinstance(v, str) and any(ord(c) < 0x20 for c in v) for r in rows for v in r)
    if got is None:
        assert has_control  # the only reason to leave a string batch to Python
    else:
        assert got.to_pylist() == want


def test_arrow_json_leaves_other_types_to_python() -> None:
    floats = pa.RecordBatch.from_pydict({"x": pa.array([1.5], pa.float64())})
    assert arrow_json(floats, ["x"]) is None
    dupes = pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    assert arrow_json(dupes, ["a", "a"]) is None
    ok = pa.RecordBatch.from_pydict({"b": [2], "a": ["x"]})
    assert arrow_json(ok, ["b", "a"]).to_pylist() == [b'{"a":"x","b":2}']
    assert json.loads(arrow_json(ok, ["b", "a"]).to_pylist()[0]) == {"a": "x", "b": 2}


def test_source_specs() -> None:
    spec = parse_source("jdbc:postgresql://db:5432/app?user=app&table=public.policies&fetchsize=5")
    assert spec.kind == "jdbc"
    assert spec.target == "jdbc:postgresql://db:5432/app?user=app"
    assert spec.options == {
        "dbtable": "public.policies",
        "fetchsize": "5",
        "driver": "org.postgresql.Driver",
    }
    assert spec.jdbc_subprotocol == "postgresql"
    spec = parse_source("jdbc:postgresql://db/app", jdbc_table="t")
    assert spec.options["dbtable"] == "t"
    assert parse_source("csv:/data/x.csv").options == {"header": "true"}
    assert parse_source("csv:/x", {"header": "false"}).options == {"header": "false"}
    assert parse_source("parquet:s3a://bucket/path").target == "s3a://bucket/path"
    assert parse_source("table:db.policies").kind == "table"
    assert parse_source("my_pkg.sources:policies").kind == "callable"
    for bad in ["", "nothing", "jdbc:postgresql://db/app", "csv:", "xml:/a", "a b:c"]:
        with pytest.raises(ConfigError):
            parse_source(bad)


def test_loading_functions() -> None:
    assert load_encoder("") is load_encoder(None)
    assert load_callable("json:dumps") is json.dumps
    for bad in ["json", "json:nope", "no_such_module_xyz:f", "json:__doc__"]:
        with pytest.raises(ConfigError):
            load_callable(bad)
