"""Row encoders: how one DataFrame row becomes one snapshot payload.

An encoder is any picklable ``Callable[[Row], bytes]``, named on the command
line as ``module:function`` (the module must be importable on the executors).
The default, :func:`json_encoder`, writes the row as compact JSON with sorted
keys, UTF-8: ``{"id":1,"name":"Ann"}``. Values JSON has no type for are
written as strings: dates and timestamps in ISO 8601, decimals exactly
(``"12.50"``), binary as base64.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs.sources import load_callable

if TYPE_CHECKING:
    from pyspark.sql import Row
    from pyspark.sql.types import DataType, StructType

Encoder = Callable[["Row"], bytes]


def _json_default(value: object) -> object:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return str(value)


_dumps = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default
).encode


def encode_json_dict(values: dict[str, Any]) -> bytes:
    """The default encoding of a row already turned into a dict."""
    return _dumps(values).encode("utf-8")


def json_encoder(row: Row) -> bytes:
    """Default encoder: ``row.asDict(recursive=True)`` as compact JSON, sorted keys, UTF-8."""
    return _dumps(row.asDict(recursive=True)).encode("utf-8")


_ESCAPED = r'[\x00-\x1f"\\]'  # what json.dumps escapes when ensure_ascii=False
_CONTROL = r"[\x00-\x1f]"


def _json_fragment(column: Any) -> Any | None:
    """One column as JSON text, computed by Arrow; None if it needs Python."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_null(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = pc.cast(column, pa.string())
        if pc.any(pc.match_substring_regex(column, _ESCAPED)).as_py():
            if pc.any(pc.match_substring_regex(column, _CONTROL)).as_py():
                return None  # rare: leave \n, \u0001 ... to json.dumps
            column = pc.replace_substring(column, "\\", "\\\\")
            column = pc.replace_substring(column, '"', '\\"')
        text = pc.binary_join_element_wise('"', column, '"', "")
    else:
        return None
    return pc.fill_null(text, "null")


def arrow_json(batch: Any, names: Sequence[str]) -> Any | None:
    """The default encoding of a whole Arrow batch, column-wise (a pyarrow BinaryArray).

    Gives the same bytes as :func:`json_encoder` on each row, for batches of
    integer, boolean and string columns; None for anything else (or strings
    with control characters), which the caller then encodes row by row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not names or len(set(names)) != len(names) or batch.num_rows == 0:
        return None
    pieces: list[Any] = []
    for i in sorted(range(len(names)), key=lambda i: names[i]):
        fragment = _json_fragment(batch.column(i))
        if fragment is None:
            return None
        pieces.append(("{" if not pieces else ",") + json.dumps(names[i], ensure_ascii=False) + ":")
        pieces.append(fragment)
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "").cast(pa.binary())


def load_encoder(ref: str | None) -> Encoder:
    """The encoder ``module:function`` names (the default one when ``ref`` is empty)."""
    if not ref:
        return json_encoder
    return load_callable(ref, "encoder")


def _plain(data_type: DataType) -> bool:
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        ByteType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        NullType,
        ShortType,
        StringType,
    )

    if isinstance(data_type, ArrayType):
        return _plain(data_type.elementType)
    # Exact classes: subclasses (char/varchar are StringType) convert alike, UDTs do not.
    return isinstance(
        data_type,
        (
            BooleanType,
            ByteType,
            ShortType,
            IntegerType,
            LongType,
            FloatType,
            DoubleType,
            StringType,
            DateType,
            DecimalType,
            NullType,
        ),
    )


def arrow_compatible(schema: StructType) -> bool:
    """Whether rows built from Arrow batches equal the rows Spark's RDD path gives.

    True for flat schemas of numbers, strings, booleans, dates, decimals and
    arrays of those; timestamps, binary, structs and maps take the RDD path.
    """
    return all(_plain(f.dataType) for f in schema.fields)


__all__ = [
    "Encoder",
    "arrow_compatible",
    "arrow_json",
    "encode_json_dict",
    "json_encoder",
    "load_encoder",
]
