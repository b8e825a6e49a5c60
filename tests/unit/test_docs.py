"""The docs do not rot: README code runs, and the reference matches the code.

* Every ```python block of README.md (and of the reference docs in
  ``RUN_DOCS``) runs, in order, in a fresh temporary directory.
* docs/configuration.md documents exactly the keys of ``lr_server.config``,
  each with its real default, and exactly the metrics of
  ``lr_server.metrics``, with their types and labels.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from lr_client.records import SnapshotStatus
from lr_client.store.ops.inspection import SinkBacklog, SinkFailures
from lr_client.store.ops.partition_lags import PartitionLag
from lr_server import config as config_module

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "configuration.md"

FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text())


def _dispose(namespace: dict[str, Any]) -> None:
    """Dispose engines the snippets left open (filterwarnings = error)."""
    for value in namespace.values():
        for candidate in (value, getattr(value, "engine", None), getattr(value, "store", None)):
            engine = getattr(candidate, "engine", candidate)
            if isinstance(engine, Engine):
                engine.dispose()


#: README plus the reference docs whose python examples must run.
RUN_DOCS = ["api.md", "architecture.md", "configuration.md", "guarantees.md", "operations.md"]
DOC_FILES = [ROOT / "README.md"] + [
    DOCS / name for name in RUN_DOCS if (DOCS / name).exists() and python_blocks(DOCS / name)
]


def readme_effects(namespace: dict[str, Any]) -> None:
    """What the README's quickstart did: entries queued per destination, a full sync asked."""
    store = namespace["client"].store
    b = [e.payload for e in store.shipping.read_log_entries("site-b", "policy", 0, 10)]
    c = [e.payload for e in store.shipping.read_log_entries("site-c", "policy", 0, 10)]
    assert (b, c) == ([b"payload", b"p2", b"from-async"], [b"payload", b"from-async"])
    (request,) = store.snapshots.list_snapshots("site-b", "policy")
    assert request.status is SnapshotStatus.READY  # the provider wrote it
    info = namespace["info"]
    assert (info.snapshot_id, info.state, info.rows_written) == (
        request.snapshot_id,
        SnapshotStatus.READY,
        2,
    )
    assert namespace["delivered"] == 0  # nothing has reached the sink yet
    assert namespace["subscriber"].store.queues.list_queues() == []


#: Per document, a check of what its blocks did (a block may also assert for itself).
EFFECTS: dict[str, Callable[[dict[str, Any]], None]] = {"README.md": readme_effects}


@pytest.mark.parametrize("path", DOC_FILES, ids=[p.name for p in DOC_FILES])
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(path)
    assert blocks, f"{path.name} has no ```python blocks"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    try:
        for i, block in enumerate(blocks):
            code = compile(block, f"{path.name}[python block {i + 1}]", "exec")
            exec(code, namespace)
        if path.name in EFFECTS:
            EFFECTS[path.name](namespace)
        else:  # the block checks its own effect
            assert any("assert " in block for block in blocks), path.name
    finally:
        _dispose(namespace)


# -- configuration reference -----------------------------------------------------------
SECTIONS: dict[str, type[Any]] = {
    "site": config_module.SiteConfig,
    "security": config_module.SecurityConfig,
    "clients": config_module.ClientConfig,
    "destinations": config_module.DestinationConfig,
    "sources": config_module.SourceConfig,
    "replication": config_module.ReplicationConfig,
    "retry": config_module.RetryConfig,
    "retention": config_module.RetentionConfig,
    "receiver": config_module.ReceiverConfig,
    "members": config_module.MembersConfig,
    "tracing": config_module.TracingConfig,
}
#: SiteConfig fields that are sections (or not settable) rather than [site] keys.
NOT_SITE_KEYS = {*SECTIONS, "path", "cascades"} - {"site"}

HEADING = re.compile(r"^### `\[\[?([a-z_]+)\]\]?`", re.MULTILINE)
ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|]*) \|", re.MULTILINE)


def documented_keys() -> dict[str, dict[str, str]]:
    """{section: {key: default cell}} from docs/configuration.md."""
    text = CONFIG_DOC.read_text()
    heads = list(HEADING.finditer(text))
    out: dict[str, dict[str, str]] = {}
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else text.find("\n## ", head.end())
        body = text[head.end() : end if end != -1 else len(text)]
        out[head.group(1)] = {m.group(1): m.group(2).strip() for m in ROW.finditer(body)}
    return out


def toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def expected_default(f: dataclasses.Field[Any]) -> str | None:
    """The TOML literal of a field's default; None if the key is required or has none."""
    if f.default is not dataclasses.MISSING:
        return None if f.default is None else toml_literal(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return toml_literal(f.default_factory())
    return None


def test_every_config_key_is_documented_with_its_default() -> None:
    docs = documented_keys()
    assert set(docs) == set(SECTIONS), "one ### `[section]` heading per config section"
    for section, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if section == "site":
            fields = {k: v for k, v in fields.items() if k not in NOT_SITE_KEYS}
        assert set(docs[section]) == set(fields), f"[{section}] keys differ from {cls.__name__}"
        for key, cell in docs[section].items():
            f = fields[key]
            want = expected_default(f)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                assert cell.startswith("required"), f"{section}.{key} is required, doc: {cell}"
            elif want is None:
                assert cell.startswith("—") or cell.startswith("none"), f"{section}.{key}: {cell}"
            else:
                shown = re.match(r"`([^`]*)`", cell)
                assert shown and shown.group(1) == want, f"{section}.{key}: doc {cell}, code {want}"


def test_documented_choices_exist_in_code() -> None:
    text = CONFIG_DOC.read_text()
    for name in ("SECURITY_TRANSPORTS", "CLIENT_AUTH_MODES"):
        for choice in getattr(config_module, name):
            assert f'`"{choice}"`' in text, f"{name} choice {choice!r} not documented"
    for choice in getattr(config_module, "SNAPSHOT_PROVIDERS", ("none", "spark")):
        assert f'`"{choice}"`' in text, f"snapshot provider {choice!r} not documented"


# -- metrics ---------------------------------------------------------------------------------
METRIC_ROW = re.compile(r"^\| `(lr_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|", re.M)


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{exposed name: (type, labels)} from the metrics table of docs/configuration.md."""
    text = CONFIG_DOC.read_text()
    section = text[text.index("\n## Metrics") :]
    out = {}
    for m in METRIC_ROW.finditer(section):
        labels = tuple(re.findall(r"`([a-z_]+)`", m.group(3)))
        out[m.group(1)] = (m.group(2), labels)
    return out


class OneQueue:
    """A sink with one receive queue, for :class:`SinkCollector`."""

    @property
    def inspection(self) -> OneQueue:  # the store's inspection role: this fake plays it
        return self

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        return [SinkBacklog("policy", "site-a", 1, 0.0)]

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        return SinkFailures({("policy", "site-a"): 1}, {})

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        return [PartitionLag("policy", "site-a", 0, 3)]


def test_metric_names_in_docs_match_lr_server_metrics() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from lr_client.listener_metrics import ListenerMetrics
    from lr_client.sink_metrics import SinkCollector
    from lr_server import metrics

    defined = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            exposed = family.name + ("_total" if family.type == "counter" else "")
            defined[exposed] = (family.type, tuple(value._labelnames))
    for family in SinkCollector(OneQueue()).collect():  # the sink's, read from its database
        defined[family.name] = (family.type, tuple(family.samples[0].labels))
    listener = ListenerMetrics(CollectorRegistry())  # and measured around its listener
    for value in (listener.batches, listener.entries, listener.apply_seconds):
        (family,) = value.describe()
        exposed = family.name + ("_total" if family.type == "counter" else "")
        defined[exposed] = (family.type, tuple(value._labelnames))
    docs = documented_metrics()
    assert docs, "no metrics table in docs/configuration.md"
    assert set(docs) - set(defined) == set(), "documented but not defined in lr_server/metrics.py"
    assert set(defined) - set(docs) == set(), "defined in lr_server/metrics.py but not documented"
    for name, (kind, labels) in docs.items():
        assert defined[name] == (kind, labels), f"{name}: doc {kind}{labels}, code {defined[name]}"


#: The pages a reader meets first show the present: dated runs move to their history.
SHORT_PAGES = ("benchmarks.md", "operations.md", "architecture.md")
MAX_PAGE_LINES = 400


@pytest.mark.parametrize("name", SHORT_PAGES)
def test_the_pages_that_show_the_present_stay_short(name: str) -> None:
    lines = len((DOCS / name).read_text().splitlines())
    assert lines <= MAX_PAGE_LINES, f"docs/{name}: {lines} lines (limit {MAX_PAGE_LINES})"
