"""The value types of the config keys, for pydantic: what each accepts, what a bad one is told.

Each type is an ``Annotated`` alias: pydantic's strict type and constraints,
then the sentence a bad value gets (``expected a positive integer, got '8'``).
Errors raised here leave the key out; :mod:`lr_server.config.errors` puts the
key in front. A *rule* (``rule(...)``) is checked only on a value of the right
type, after every key of its table has been type-checked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from annotated_types import Ge, Gt, Lt
from pydantic import (
    AfterValidator,
    BeforeValidator,
    PlainValidator,
    Strict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from lr_client.names import NAME_RE

#: Error types: a value of the wrong type or form; a rule on a value of the right type;
#: a site id, client or node name (its message names the key twice, see errors.py).
VALUE, RULE, NAME = "lr_value", "lr_rule", "lr_name"

#: ``site.database_url`` schemes the store runs on (``postgres`` is read as ``postgresql``).
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")
SUPPORTED_DATABASES = "sqlite:///PATH, postgresql://... or postgresql+psycopg://..."

T = TypeVar("T")


def expect(text: str) -> WrapValidator:
    """Report any failure of the type it follows as ``text`` (``{got}``: the value's repr)."""

    def wrap(value: object, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(VALUE, text, {"got": repr(value)}) from None

    return WrapValidator(wrap)


def rule(holds: Callable[[T], bool], text: str) -> AfterValidator:
    """A check of a value already of its type: ``text`` when ``holds(value)`` is false."""

    def check(value: T) -> T:
        if not holds(value):
            raise PydanticCustomError(RULE, text, {"got": repr(value)})
        return value

    return AfterValidator(check)


def one_of(choices: tuple[str, ...]) -> AfterValidator:
    """A string that is one of ``choices``."""
    return rule(lambda value: value in choices, f"expected one of {choices}")


def _a_list(text: str) -> BeforeValidator:
    """Refuse anything but a list (a TOML array) before its items are checked."""

    def check(value: object) -> object:
        if not isinstance(value, list):
            raise PydanticCustomError(VALUE, text)
        return value

    return BeforeValidator(check)


def _a_table(value: object) -> object:
    if not isinstance(value, dict):
        raise PydanticCustomError(VALUE, "expected a table")
    return value


def name(value: object) -> str:
    """A site id, client or node name: ``[a-z0-9][a-z0-9-]{0,62}`` (lr_client.names)."""
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        raise PydanticCustomError(NAME, "invalid name", {"value": value})
    return value


def _names(value: object) -> tuple[str, ...]:
    """A list of names checked as one key (``cascade.<client>.branches``: no index)."""
    if not isinstance(value, list):
        raise PydanticCustomError(VALUE, "expected a list of node names")
    return tuple(name(v) for v in value)


def host_port(value: object) -> str:
    """``host:port`` with a port from 1 to 65535."""
    if isinstance(value, str) and ":" in value:
        host, _, port = value.rpartition(":")
        if host and port.isdigit() and 0 < int(port) < 65536:
            return value
    raise PydanticCustomError(VALUE, "expected host:port, got {got}", {"got": repr(value)})


def _listen(value: object) -> str:
    return "" if value == "" else host_port(value)


def _database_url(value: object) -> str:
    """A URL of a database the store runs on. The value is never echoed: it may hold a
    password."""
    if not isinstance(value, str) or not value:
        raise PydanticCustomError(VALUE, f"expected a database URL ({SUPPORTED_DATABASES})")
    try:
        scheme = make_url(value).drivername
    except ArgumentError:
        raise PydanticCustomError(
            VALUE, f"not a database URL; expected {SUPPORTED_DATABASES}"
        ) from None
    if scheme not in DATABASE_SCHEMES:
        raise PydanticCustomError(
            VALUE, f"unsupported database {scheme!r}; supported: {SUPPORTED_DATABASES}"
        )
    return value


def _path(value: object, info: ValidationInfo) -> Path:
    """A path string; relative to the config file's directory (``context["base"]``)."""
    if not isinstance(value, str):
        raise PydanticCustomError(VALUE, "expected a path string")
    base = (info.context or {}).get("base")
    path = Path(value)
    return path if path.is_absolute() or base is None else base / path


def _spark_options(value: object) -> dict[str, str]:
    """A table of Spark settings; keys and values are taken as their text."""
    if not isinstance(value, dict):
        raise PydanticCustomError(VALUE, "expected a table")
    return {str(k): str(v) for k, v in value.items()}


PositiveInt = Annotated[int, Strict(), Gt(0), expect("expected a positive integer, got {got}")]
#: A count that may be 0 (a limit: 0 is none).
Count = Annotated[int, Strict(), Ge(0), expect("expected a non-negative integer, got {got}")]
#: A non-negative number (an integer is taken as a float).
Number = Annotated[float, Strict(), Ge(0), expect("expected a non-negative number, got {got}")]
PositiveNumber = Annotated[Number, rule(lambda v: v > 0, "expected a positive number")]
Flag = Annotated[bool, Strict(), expect("expected true or false")]
Text = Annotated[str, Strict(), expect("expected a string, got {got}")]
Port = Annotated[int, Strict(), Ge(0), Lt(65536), expect("expected a port number, got {got}")]
#: A name, whatever it was given as (a missing one is None: ``invalid site.id None``).
Name = Annotated[str, PlainValidator(name)]
#: A string, then a name (``expected a string`` for a number).
TextName = Annotated[Text, AfterValidator(name)]
Names = Annotated[tuple[Name, ...], _a_list("expected a list of client names")]
NodeNames = Annotated[tuple[str, ...], PlainValidator(_names)]
#: ``[cascade.<client>] nodes``: node -> its provider.
NodeMap = Annotated[dict[Name, Name], BeforeValidator(_a_table)]
HostPort = Annotated[str, PlainValidator(host_port)]
HostPorts = Annotated[tuple[HostPort, ...], _a_list("expected a list of host:port")]
#: A string, then ``host:port``.
Address = Annotated[Text, AfterValidator(host_port)]
#: A string, then ``host:port`` unless empty.
OptionalAddress = Annotated[Text, AfterValidator(_listen)]
#: ``site.listen``: empty, or ``host:port``.
Listen = Annotated[str, PlainValidator(_listen)]
DatabaseUrl = Annotated[str, PlainValidator(_database_url)]
FilePath = Annotated[Path | None, PlainValidator(_path)]
SparkOptions = Annotated[dict[str, str], PlainValidator(_spark_options)]
