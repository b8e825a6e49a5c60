"""One table of the config validated by pydantic; its first fault as a one-line ConfigError.

The message starts with the key at fault (``destinations[1].address: expected
host:port, got 'b'``); :func:`lr_server.config.load_config` adds the file.
When a table has several faults the first is named: an unknown key or a value
of the wrong type, in the order of the table; then a missing key, in the order
of the fields; then a rule on a value (``retention.soft_fraction: expected a
number in (0, 1]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from lr_client.errors import ConfigError, InvalidNameError
from lr_client.names import validate_name
from lr_server.config.values import NAME, RULE

T = TypeVar("T")

_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")
_NOT_A_TABLE = ("dataclass_type", "dataclass_args_type")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """One adapter per class, built at its first use (building one compiles its schema)."""
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def validate(
    cls: type[T],
    raw: object,
    key: str,
    *,
    base: Path | None = None,
    known: Sequence[str] | None = None,
) -> T:
    """``raw`` (a TOML table) as a ``cls`` (a dataclass whose field types say what they take).

    ``key`` is the table's own key (``destinations[0]``); ``base`` the directory
    relative paths are taken from; ``known`` the keys an unknown one is told of
    (default: the fields, sorted). Raises :class:`ConfigError` naming the key at fault.
    """
    try:
        value: T = _adapter(cls).validate_python(raw, context={"base": base})
    except ValidationError as exc:
        fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        first = min(exc.errors(), key=lambda e: _rank(e, raw, fields))
        raise ConfigError(describe(first, key, known or sorted(fields))) from None
    return value


def in_order(table: object, keys: Sequence[str], absent_as_none: Sequence[str] = ()) -> object:
    """``table`` with its unknown keys first, then ``keys`` in their order, so that its
    first fault is found in that order; each key of ``absent_as_none`` that is missing
    is given as None, to be named by its own type (``site.id: invalid site.id None``)."""
    if not isinstance(table, dict):
        return table
    unknown = {k: v for k, v in table.items() if k not in keys}
    return unknown | {k: table.get(k) for k in keys if k in table or k in absent_as_none}


def _rank(error: ErrorDetails, raw: object, fields: list[str]) -> tuple[int, int, str]:
    loc = error["loc"]
    head = str(loc[0]) if loc else ""
    if error["type"] == "missing":
        return 1, fields.index(head) if head in fields else 0, str(loc)
    order = list(raw) if isinstance(raw, dict) else []
    position = order.index(head) if head in order else -1
    return (2 if error["type"] == RULE else 0), position, str(loc)


def key_of(table: str, loc: tuple[int | str, ...]) -> str:
    """The config key of a pydantic location: ``destinations[0]`` + ``("addresses", 1)``
    is ``destinations[0].addresses[1]``; a bad key of a table is the table's key."""
    if loc and loc[-1] == "[key]":
        loc = loc[:-2]
    return table + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def describe(error: ErrorDetails, table: str, known: Sequence[str]) -> str:
    """The one-line message of one pydantic error in ``table``."""
    kind, key = error["type"], key_of(table, error["loc"])
    if kind == "missing":
        return f"{key}: required"
    if kind in _UNKNOWN:
        return f"{key}: unknown key (known: {', '.join(known)})"
    if kind in _NOT_A_TABLE:
        return f"{key}: expected a table"
    if kind == NAME:
        return name_error(error.get("ctx", {}).get("value"), key)
    return f"{key}: {error['msg']}"


def name_error(value: object, key: str) -> str:
    """``site.id: invalid site.id 'Site_A': expected [a-z0-9][a-z0-9-]{0,62}``."""
    try:
        validate_name(value, key)
    except InvalidNameError as exc:
        return f"{key}: {exc}"
    return f"{key}: invalid name"  # pragma: no cover - only a bad name is reported
