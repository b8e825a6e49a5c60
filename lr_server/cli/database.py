"""The site's database as the commands open it: a SQLite file is created only by
``init-db`` and ``server``, and every error names the key or the database at fault."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from lr_client.errors import ConfigError, SchemaError, StoreUnavailableError
from lr_server.admin.database import database_url
from lr_server.cli.errors import fail, first_line
from lr_server.config import SiteConfig

if TYPE_CHECKING:
    from lr_client.store import QueueStore


def sqlite_file(config: SiteConfig) -> Path | None:
    """The file of a SQLite ``site.database_url`` (None for PostgreSQL or in-memory)."""
    url = database_url(config)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


def require_database(config: SiteConfig) -> None:
    """Fail (exit 1) if the site's SQLite file does not exist: reading never creates it."""
    path = sqlite_file(config)
    if path is not None and not path.exists():
        where = f"--config {config.path}" if config.path else "--config FILE"
        missing = "" if path.parent.is_dir() else f" (no directory {path.parent})"
        fail(
            f"the database {path} does not exist{missing}; "
            f"`lr init-db {where}` creates it (site.database_url)"
        )


def make_database_directory(config: SiteConfig) -> None:
    """Create the directory of the site's SQLite file (``init-db``, ``server``)."""
    path = sqlite_file(config)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot create the directory {path.parent} of the database: {exc.strerror or exc}")


@contextmanager
def open_site_store(
    config: SiteConfig, *, check: bool = True, create: bool = False
) -> Iterator[QueueStore]:
    """The site's store (schema checked unless ``check`` is false); disposed on exit.

    Only with ``create`` may a missing SQLite file be created; otherwise it is an
    error naming the file. Errors while opening name the database.
    """
    from lr_client.store import open_store

    where = database_url(config).render_as_string(hide_password=True)
    if create:
        make_database_directory(config)
    else:
        require_database(config)
    try:
        store = open_store(config.database_url)
    except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
        raise ConfigError(f"site.database_url: {first_line(exc)}") from exc
    try:
        if check:
            store.check_schema()
        yield store
    except (SchemaError, StoreUnavailableError, SQLAlchemyError) as exc:
        fail(f"{where}: {first_line(getattr(exc, 'orig', None) or exc)}")
    finally:
        store.close()
