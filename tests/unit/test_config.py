"""Site config parsing: a good file, and every kind of bad key named in the error."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lr_client.errors import ConfigError
from lr_client.records import Backlog
from lr_server.config import (
    ClientConfig,
    RetentionConfig,
    SiteConfig,
    SnapshotProvider,
    SourceConfig,
    load_config,
    parse_config,
)
from lr_server.server import SiteServer

GOOD = """
[site]
id = "site-a"
database_url = "sqlite:///data/a.db"
listen = "0.0.0.0:7443"
metrics_port = 9464

[security]
transport = "tls"
client_auth = "mtls"
ca_file = "pki/ca.pem"
cert_file = "pki/site-a.pem"
key_file = "pki/site-a.key"

[[clients]]
name = "policy"
snapshot = "spark"
spark_source = "parquet:/data/policy"
spark_encoder = "app.codec:encode_row"
spark_key_column = "region"
spark_master = "spark://m:7077"
spark_options = { "spark.executor.memory" = "2g", parallelism = 8 }

[[clients]]
name = "inventory"

[[destinations]]
id = "site-b"
address = "b.example.net:7443"
server_name = "site-b"

[[destinations]]
id = "site-c"
address = "10.0.0.3:7443"
clients = ["policy"]

[[sources]]
id = "site-b"

[replication]
batch_max_entries = 100
window_batches = 4
poll_interval = 0.5

[retry]
max_backoff = 10

[retention]
max_entries = 1000
soft_fraction = 0.25
"""


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    (tmp_path / "pki").mkdir()
    for name in ("ca.pem", "site-a.pem", "site-a.key"):
        (tmp_path / "pki" / name).write_text("x")
    return tmp_path


def test_good_config(site_dir: Path) -> None:
    path = site_dir / "site-a.toml"
    path.write_text(GOOD)
    cfg = load_config(path)
    assert isinstance(cfg, SiteConfig)
    assert (cfg.id, cfg.listen, cfg.metrics_port) == ("site-a", "0.0.0.0:7443", 9464)
    # Relative paths are relative to the config file's directory.
    assert cfg.database_url == f"sqlite:///{(site_dir / 'data' / 'a.db').resolve()}"
    assert cfg.security.ca_file == site_dir.resolve() / "pki" / "ca.pem"
    assert cfg.security.client_auth == "mtls"
    assert [d.id for d in cfg.destinations] == ["site-b", "site-c"]
    assert cfg.destinations[0].server_name == "site-b"
    assert cfg.clients_for(cfg.destinations[0]) == ["policy", "inventory"]
    assert cfg.clients_for(cfg.destinations[1]) == ["policy"]
    policy = cfg.client("policy")
    assert policy is not None and policy.snapshot == "spark"
    assert policy.spark_options == {"spark.executor.memory": "2g", "parallelism": "8"}
    assert policy.spark_key_column == "region"
    inventory = cfg.client("inventory")
    assert inventory is not None and inventory.spark_key_column == ""
    assert cfg.client("nope") is None
    assert cfg.source("site-b") is not None and cfg.source("site-z") is None
    assert cfg.replication.batch_max_entries == 100
    assert cfg.replication.poll_interval == 0.5
    assert cfg.retry.max_backoff == 10.0 and isinstance(cfg.retry.max_backoff, float)
    assert cfg.retention.soft_fraction == 0.25
    assert cfg.path == path.resolve()


def test_a_source_address_and_the_cascade_settings() -> None:
    raw = base()
    raw["sources"][0].update(address="c:7000", server_name="c.example")
    raw["replication"] = {"cascade_report_interval": 2.5, "cascade_grace": 10}
    cfg = parse_config(raw)
    assert cfg.sources[0] == SourceConfig("site-c", "t-c", "c:7000", "c.example")
    assert (cfg.replication.cascade_report_interval, cfg.replication.cascade_grace) == (2.5, 10.0)
    defaults = parse_config(base())
    assert defaults.sources[0].address == ""
    assert (defaults.replication.cascade_report_interval, defaults.replication.cascade_grace) == (
        1.0,
        30.0,
    )


def test_defaults_of_a_minimal_config() -> None:
    cfg = parse_config(
        {
            "site": {"id": "a", "database_url": "postgresql://db/lr"},
            "security": {"transport": "plaintext", "client_auth": "token"},
        }
    )
    assert cfg.listen == "" and cfg.metrics_port == 0
    assert cfg.destinations == () and cfg.sources == () and cfg.clients == ()
    assert cfg.database_url == "postgresql://db/lr"
    assert cfg.replication.batch_max_entries == 500
    assert cfg.replication.window_batches == 8
    assert cfg.retention.soft_fraction == 0.5


def base() -> dict[str, Any]:
    """A valid plaintext + token config as a parsed TOML document."""
    return {
        "site": {"id": "site-a", "database_url": "sqlite:////tmp/a.db", "listen": "h:7000"},
        "security": {"transport": "plaintext", "client_auth": "token", "token": "t-a"},
        "clients": [{"name": "policy"}],
        "destinations": [{"id": "site-b", "address": "b:7000"}],
        "sources": [{"id": "site-c", "token": "t-c"}],
    }


Mutation = Callable[[dict[str, Any]], object]


def _set(section: str, key: str, value: object) -> Mutation:
    return lambda raw: raw.setdefault(section, {}).__setitem__(key, value)


def _item(section: str, i: int, key: str, value: object) -> Mutation:
    return lambda raw: raw[section][i].__setitem__(key, value)


def _drop(section: str, key: str | None = None) -> Mutation:
    return lambda raw: raw.pop(section) if key is None else raw[section].pop(key)


def _drop_item(section: str, i: int, key: str) -> Mutation:
    return lambda raw: raw[section][i].pop(key)


def _append(section: str, item: dict[str, Any]) -> Mutation:
    return lambda raw: raw.setdefault(section, []).append(item)


BAD: list[tuple[str, Mutation, str]] = [
    ("unknown section", _set("bogus", "x", 1), "bogus"),
    ("unknown site key", _set("site", "name", "x"), "site.name"),
    ("no site", _drop("site"), "site"),
    ("no site id", _drop("site", "id"), "site.id"),
    ("bad site id", _set("site", "id", "Site_A"), "site.id"),
    ("site id with _", _set("site", "id", "site_a"), "site.id"),
    ("site id too long", _set("site", "id", "a" * 64), "site.id"),
    ("no database url", _drop("site", "database_url"), "site.database_url"),
    ("empty database url", _set("site", "database_url", ""), "site.database_url"),
    ("listen without port", _set("site", "listen", "localhost"), "site.listen"),
    ("listen port too big", _set("site", "listen", "h:70000"), "site.listen"),
    ("listen port not a number", _set("site", "listen", "h:http"), "site.listen"),
    ("metrics port", _set("site", "metrics_port", 65536), "site.metrics_port"),
    ("metrics port type", _set("site", "metrics_port", "9464"), "site.metrics_port"),
    ("unknown security key", _set("security", "tokn", "x"), "security.tokn"),
    ("bad transport", _set("security", "transport", "ssl"), "security.transport"),
    ("bad client auth", _set("security", "client_auth", "password"), "security.client_auth"),
    ("mtls without tls", _set("security", "client_auth", "mtls"), "security.client_auth"),
    ("no token for a destination", _drop("security", "token"), "destinations[0].token"),
    ("no token of a source", lambda raw: raw["sources"][0].pop("token"), "sources[0].token"),
    ("bad destination id", _item("destinations", 0, "id", "B"), "destinations[0].id"),
    ("destination is self", _item("destinations", 0, "id", "site-a"), "destinations[0].id"),
    ("bad address", _item("destinations", 0, "address", "b"), "destinations[0].address"),
    ("address port 0", _item("destinations", 0, "address", "b:0"), "destinations[0].address"),
    ("unknown destination key", _item("destinations", 0, "port", 1), "destinations[0].port"),
    (
        "destination client not configured",
        _item("destinations", 0, "clients", ["inventory"]),
        "destinations[0].clients[0]",
    ),
    (
        "destination clients not a list",
        _item("destinations", 0, "clients", "policy"),
        "destinations[0].clients",
    ),
    (
        "duplicate destination",
        _append("destinations", {"id": "site-b", "address": "b2:7000"}),
        "destinations",
    ),
    ("duplicate source", _append("sources", {"id": "site-c", "token": "x"}), "sources"),
    ("bad source id", _item("sources", 0, "id", "C!"), "sources[0].id"),
    ("sources without listen", _drop("site", "listen"), "site.listen"),
    ("bad client name", _item("clients", 0, "name", "Policy"), "clients[0].name"),
    ("duplicate client", _append("clients", {"name": "policy"}), "clients"),
    ("unknown snapshot provider", _item("clients", 0, "snapshot", "magic"), "clients[0].snapshot"),
    ("spark without source", _item("clients", 0, "snapshot", "spark"), "clients[0].spark_source"),
    ("unknown client key", _item("clients", 0, "encoder", "x"), "clients[0].encoder"),
    (
        "zero batch size",
        _set("replication", "batch_max_entries", 0),
        "replication.batch_max_entries",
    ),
    (
        "zero snapshot batch size",
        _set("replication", "snapshot_batch_max_entries", 0),
        "replication.snapshot_batch_max_entries",
    ),
    ("int as string", _set("replication", "window_batches", "8"), "replication.window_batches"),
    ("bool as int", _set("replication", "window_bytes", True), "replication.window_bytes"),
    ("negative float", _set("retry", "initial_backoff", -1), "retry.initial_backoff"),
    ("unknown retry key", _set("retry", "attempts", 3), "retry.attempts"),
    ("retired key", _set("retention", "backpressure", "wait"), "retention.backpressure"),
    ("soft fraction > 1", _set("retention", "soft_fraction", 1.5), "retention.soft_fraction"),
    ("soft fraction 0", _set("retention", "soft_fraction", 0), "retention.soft_fraction"),
    (
        "stall timeout 0",
        _set("replication", "snapshot_stall_timeout", 0),
        "replication.snapshot_stall_timeout",
    ),
    (
        "shared reader not bool",
        _set("replication", "shared_reader", 1),
        "replication.shared_reader",
    ),
    (
        "notify subscribers not bool",
        _set("receiver", "notify_subscribers", "yes"),
        "receiver.notify_subscribers",
    ),
    (
        "shared reader window 0",
        _set("replication", "shared_reader_entries", 0),
        "replication.shared_reader_entries",
    ),
    ("mysql database", _set("site", "database_url", "mysql://u@h/db"), "site.database_url"),
    ("oracle database", _set("site", "database_url", "oracle://h/db"), "site.database_url"),
    (
        "async driver",
        _set("site", "database_url", "postgresql+asyncpg://h/db"),
        "site.database_url",
    ),
    ("not a url", _set("site", "database_url", "garbage"), "site.database_url"),
    ("url not a string", _set("site", "database_url", 5), "site.database_url"),
    ("destinations not tables", lambda raw: raw.__setitem__("destinations", 5), "destinations"),
    ("clients not tables", lambda raw: raw.__setitem__("clients", "policy"), "clients"),
    (
        "destination without address",
        _drop_item("destinations", 0, "address"),
        "destinations[0].address",
    ),
    ("destination without id", _drop_item("destinations", 0, "id"), "destinations[0].id"),
    (
        "no stream per destination",
        _set("replication", "streams_per_destination", 0),
        "replication.streams_per_destination",
    ),
    (
        "too many streams per destination",
        _set("replication", "streams_per_destination", 17),
        "replication.streams_per_destination",
    ),
    (
        "batch larger than a message",
        _set("replication", "batch_max_bytes", 65 * 1024 * 1024 - 64 * 1024),
        "replication.batch_max_bytes",
    ),
    ("source address without port", _item("sources", 0, "address", "c"), "sources[0].address"),
    (
        "no cascade report interval",
        _set("replication", "cascade_report_interval", 0),
        "replication.cascade_report_interval",
    ),
    (
        "cascade grace below the report interval",
        _set("replication", "cascade_grace", 0.5),
        "replication.cascade_grace",
    ),
]


@pytest.mark.parametrize(("mutate", "key"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_key_is_named(mutate: Mutation, key: str) -> None:
    raw = copy.deepcopy(base())
    parse_config(copy.deepcopy(raw))  # the base is valid
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    message = str(info.value)
    assert message == key or message.startswith(key + ":") or message.startswith(key + " "), message


def test_plaintext_only_when_written_explicitly() -> None:
    raw = base()
    del raw["security"]["transport"]  # default is TLS, which needs certificate files
    with pytest.raises(ConfigError, match=r"^security\.ca_file: required"):
        parse_config(raw)
    raw = base()
    del raw["security"]
    with pytest.raises(ConfigError, match=r"^security\.ca_file"):
        parse_config(raw)


def plaintext_only(
    listen: str = "127.0.0.1:7000", address: str = "localhost:7001"
) -> dict[str, Any]:
    """A trial config: ``transport = "plaintext"`` and nothing else in [security]."""
    return {
        "site": {"id": "site-a", "database_url": "sqlite:////tmp/a.db", "listen": listen},
        "security": {"transport": "plaintext"},
        "clients": [{"name": "policy"}],
        "destinations": [{"id": "site-b", "address": address}],
        "sources": [{"id": "site-b"}],
    }


@pytest.mark.parametrize(
    ("listen", "address"),
    [("127.0.0.1:7000", "localhost:7001"), ("[::1]:7000", "127.0.0.2:7001"), ("", "[::1]:7001")],
)
def test_plaintext_alone_is_a_loopback_trial_without_client_authentication(
    listen: str, address: str
) -> None:
    raw = plaintext_only(listen, address)
    if not listen:
        del raw["site"]["listen"], raw["sources"]
    cfg = parse_config(raw)
    assert (cfg.security.transport, cfg.security.client_auth) == ("plaintext", "none")
    assert cfg.listen == listen and cfg.destinations[0].address == address


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (_set("site", "listen", "0.0.0.0:7000"), "site.listen"),
        (_set("site", "listen", "10.1.2.3:7000"), "site.listen"),
        (_item("destinations", 0, "address", "b.example.net:7001"), "destinations[0].address"),
        (_set("security", "token", "t"), "security.token"),
        (_item("sources", 0, "token", "t"), "sources[0].token"),
        (_item("destinations", 0, "token", "t"), "destinations[0].token"),
        (_set("security", "client_auth", "mtls"), "security.client_auth"),
    ],
)
def test_plaintext_without_client_authentication_is_refused_off_loopback(
    mutate: Mutation, key: str
) -> None:
    raw = plaintext_only()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(key + ":"), info.value


def test_client_auth_none_needs_plaintext(site_dir: Path) -> None:
    path = site_dir / "site-a.toml"
    path.write_text(GOOD.replace('client_auth = "mtls"', 'client_auth = "none"'))
    with pytest.raises(ConfigError, match=r"^security\.client_auth: 'none' needs"):
        load_config(path)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////tmp/a.db",
        "postgresql://u@h/db",
        "postgresql+psycopg://u@h/db",
        "postgres://h/db",
    ],
)
def test_supported_database_urls(url: str) -> None:
    raw = base()
    raw["site"]["database_url"] = url
    assert parse_config(raw).database_url == url


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "site.toml"
    path.write_text('[site]\nid = "a"\ndatabase_url = "mysql://u:secret@h/db"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith("site.database_url: unsupported database 'mysql'")
    assert str(info.value).endswith(f"(in {path})")
    assert "secret" not in str(info.value)


TLS_FILES = {"ca_file": "ca.pem", "cert_file": "site-a.pem", "key_file": "site-a.key"}


@pytest.mark.parametrize("missing", sorted(TLS_FILES))
def test_tls_files_must_exist(site_dir: Path, missing: str) -> None:
    (site_dir / "pki" / TLS_FILES[missing]).unlink()
    path = site_dir / "site-a.toml"
    path.write_text(GOOD)
    with pytest.raises(ConfigError, match=rf"^security\.{missing}: no such file"):
        load_config(path)


def test_tls_file_required(site_dir: Path) -> None:
    path = site_dir / "site-a.toml"
    path.write_text(GOOD.replace('key_file = "pki/site-a.key"\n', ""))
    with pytest.raises(ConfigError, match=r"^security\.key_file: required"):
        load_config(path)


def test_token_per_destination_is_enough() -> None:
    raw = base()
    del raw["security"]["token"]
    raw["destinations"][0]["token"] = "only-for-b"
    cfg = parse_config(raw)
    assert cfg.destinations[0].token == "only-for-b"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[site\nid = 1\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_a_client_snapshot_provider_is_an_enum_whatever_it_was_given_as() -> None:
    assert ClientConfig("c", snapshot="spark").snapshot is SnapshotProvider.SPARK
    assert ClientConfig("c").snapshot is SnapshotProvider.NONE
    with pytest.raises(ValueError):
        ClientConfig("c", snapshot="cron")


LIMITS = RetentionConfig(max_entries=100, max_bytes=1000, max_age_seconds=60.0, soft_fraction=0.5)


@pytest.mark.parametrize(
    ("entries", "nbytes", "oldest", "expected"),
    [
        pytest.param(0, 0, None, (0.0, False, False), id="empty"),
        pytest.param(49, 0, None, (0.0, False, False), id="entries-below-soft"),
        pytest.param(50, 0, None, (0.0, True, False), id="entries-at-soft"),
        pytest.param(100, 0, None, (0.0, True, True), id="entries-at-limit"),
        pytest.param(0, 500, None, (0.0, True, False), id="bytes-at-soft"),
        pytest.param(0, 1000, None, (0.0, True, True), id="bytes-at-limit"),
        pytest.param(0, 0, 970.0, (30.0, True, False), id="age-at-soft"),
        pytest.param(0, 0, 940.0, (60.0, True, True), id="age-at-limit"),
        pytest.param(0, 0, 1010.0, (0.0, False, False), id="clock-skew-counts-as-new"),
    ],
)
def test_retention_measures_a_backlog_by_its_worst_limit(
    entries: int, nbytes: int, oldest: float | None, expected: tuple[float, bool, bool]
) -> None:
    backlog = Backlog("b", "c", entries=entries, bytes=nbytes, oldest_created_at=oldest)
    assert LIMITS.measure(backlog, now=1000.0) == expected


def test_retention_without_an_age_limit_never_judges_by_age() -> None:
    limits = RetentionConfig(max_entries=100, max_bytes=1000, max_age_seconds=0.0)
    assert limits.measure(Backlog("b", "c", 1, 1, oldest_created_at=0.0), 1e9) == (
        1e9,
        False,
        False,
    )


def test_streams_per_destination_defaults_to_one_and_is_read() -> None:
    assert parse_config(base()).replication.streams_per_destination == 1
    raw = base()
    raw.setdefault("replication", {})["streams_per_destination"] = 4
    assert parse_config(raw).replication.streams_per_destination == 4


def test_the_receiver_notifies_subscribers_unless_told_not_to(tmp_path: Path) -> None:
    assert parse_config(base()).receiver.notify_subscribers is True
    raw = base()
    raw["site"]["database_url"] = f"sqlite:///{tmp_path / 'a.db'}"
    raw["receiver"] = {"notify_subscribers": False}
    cfg = parse_config(raw)
    assert cfg.receiver.notify_subscribers is False
    server = SiteServer(cfg)  # what the receiver's store is told
    try:
        assert server.store.recv.notify_arrivals is False
    finally:
        server.store.close()


@pytest.mark.parametrize("listen", [False, 0, [], 7000])
def test_a_listen_that_is_not_a_string_is_refused(listen: object) -> None:
    """Only an empty string means "send only"; false or 0 is not taken for it."""
    raw = base()
    del raw["sources"]
    raw["site"]["listen"] = listen
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value) == f"site.listen: expected host:port, got {listen!r}"
    raw["site"]["listen"] = ""
    assert parse_config(raw).listen == ""


def test_tracing_is_off_unless_enabled_and_its_keys_are_checked() -> None:
    assert parse_config(base()).tracing.enabled is False
    raw = base()
    raw["tracing"] = {"enabled": True}
    assert parse_config(raw).tracing.enabled is True
    raw["tracing"] = {"enabled": "yes"}
    with pytest.raises(ConfigError, match=r"tracing\.enabled"):
        parse_config(raw)
    raw["tracing"] = {"exporter": "otlp"}
    with pytest.raises(ConfigError, match=r"tracing\.exporter"):
        parse_config(raw)
