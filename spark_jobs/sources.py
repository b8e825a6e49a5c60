"""Where a snapshot's rows come from: a source spec turned into a DataFrame.

Source specs (``--source`` of the job, ``spark_source`` of a client's config):

``jdbc:<jdbc url>?table=<table>``
    a table (or ``query=<select>``) read through Spark's JDBC reader; the
    reader options ``table``/``dbtable``, ``query``, ``partitionColumn``,
    ``lowerBound``, ``upperBound``, ``numPartitions``, ``fetchsize``,
    ``driver`` are taken out of the query string, the rest stays in the URL
    (``jdbc:postgresql://db:5432/app?user=app&table=public.policies``).
``parquet:<path>``, ``orc:<path>``, ``json:<path>``
    files Spark reads itself.
``csv:<path>``
    CSV files with a header line (every column a string unless
    ``inferSchema=true`` is given as a source option).
``table:<name>``
    a table of the session's catalog.
``<module>:<function>``
    ``function(spark)`` returns the DataFrame; the module must be importable
    by the driver.

Extra reader options (``--source-option key=value``) apply to every kind.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from lr_client.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FILE_FORMATS = ("parquet", "csv", "json", "orc")
JDBC_READER_OPTIONS = {
    "table": "dbtable",
    "dbtable": "dbtable",
    "query": "query",
    "partitioncolumn": "partitionColumn",
    "lowerbound": "lowerBound",
    "upperbound": "upperBound",
    "numpartitions": "numPartitions",
    "fetchsize": "fetchsize",
    "driver": "driver",
    "customschema": "customSchema",
    "pushdownpredicate": "pushDownPredicate",
    "sessioninitstatement": "sessionInitStatement",
}
#: JDBC driver classes Spark may not find on its own.
JDBC_DRIVERS = {"postgresql": "org.postgresql.Driver", "sqlite": "org.sqlite.JDBC"}
#: Where Debian's libpostgresql-jdbc-java installs the PostgreSQL JDBC driver.
DEBIAN_POSTGRESQL_JAR = "/usr/share/java/postgresql.jar"

_REF_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source spec."""

    kind: str  # "jdbc", one of FILE_FORMATS, "table" or "callable"
    target: str  # the JDBC URL, path, table name or "module:function"
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def jdbc_subprotocol(self) -> str:
        """``postgresql`` for ``jdbc:postgresql://...`` (empty unless JDBC)."""
        if self.kind != "jdbc":
            return ""
        return self.target.split(":", 2)[1] if self.target.count(":") >= 2 else ""


def parse_source(
    spec: str, options: Mapping[str, str] | None = None, *, jdbc_table: str | None = None
) -> SourceSpec:
    """Parse a source spec; raise :class:`~lr_client.errors.ConfigError` if it is not one."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("source: expected jdbc:, parquet:, csv:, json:, orc:, table: or mod:fn")
    spec = spec.strip()
    opts = dict(options or {})
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise ConfigError(f"source {spec!r}: expected <kind>:<target> or <module>:<function>")
    if kind == "jdbc":
        url, _, query = spec.partition("?")
        kept: list[tuple[str, str]] = []
        for key, value in parse_qsl(query, keep_blank_values=True):
            name = JDBC_READER_OPTIONS.get(key.lower())
            if name is None:
                kept.append((key, value))
            else:
                opts[name] = value
        if jdbc_table:
            opts["dbtable"] = jdbc_table
        if kept:
            url = url + "?" + urlencode(kept)
        if "dbtable" not in opts and "query" not in opts:
            raise ConfigError(f"source {spec!r}: a JDBC source needs ?table=<table> or ?query=")
        driver = JDBC_DRIVERS.get(url.split(":", 2)[1] if url.count(":") >= 2 else "")
        if driver:
            opts.setdefault("driver", driver)
        return SourceSpec("jdbc", url, opts)
    if kind in FILE_FORMATS or kind == "table":
        if not rest:
            raise ConfigError(f"source {spec!r}: missing the path or table name")
        if kind == "csv":
            opts.setdefault("header", "true")
        return SourceSpec(kind, rest, opts)
    if _REF_RE.fullmatch(spec):
        return SourceSpec("callable", spec, opts)
    raise ConfigError(
        f"source {spec!r}: unknown kind {kind!r} (jdbc, {', '.join(FILE_FORMATS)}, table,"
        " or module:function)"
    )


def load_callable(ref: str, what: str = "function") -> Callable[..., Any]:
    """Import ``module:function`` (a dotted attribute path is allowed after the colon)."""
    if not isinstance(ref, str) or not _REF_RE.fullmatch(ref):
        raise ConfigError(f"{what} {ref!r}: expected module:function")
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {ref!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{what} {ref!r}: {module_name} has no {attr!r}") from exc
    if not callable(obj):
        raise ConfigError(f"{what} {ref!r} is not callable")
    return obj  # type: ignore[no-any-return]


def load_dataframe(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The DataFrame a source spec names."""
    if source.kind == "jdbc":
        return (
            spark.read.format("jdbc").option("url", source.target).options(**source.options).load()
        )
    if source.kind in FILE_FORMATS:
        reader = spark.read.options(**source.options)
        return reader.format(source.kind).load(source.target)
    if source.kind == "table":
        return spark.read.options(**source.options).table(source.target)
    fn = load_callable(source.target, "source")
    df = fn(spark)
    if not hasattr(df, "mapInArrow") or not hasattr(df, "schema"):
        raise ConfigError(f"source {source.target!r} returned {type(df).__name__}, not a DataFrame")
    return df  # type: ignore[no-any-return]


__all__ = [
    "DEBIAN_POSTGRESQL_JAR",
    "SourceSpec",
    "load_callable",
    "load_dataframe",
    "parse_source",
]
