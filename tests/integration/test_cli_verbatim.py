"""``lr`` shows text from the data verbatim: never read as rich markup (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_server.cli import cli
from lr_server.demo.sites import demo_console
from tests.integration.test_cli import ok, transmit, write_config

#: Text that rich would read as markup (or an emoji code) if it were not escaped.
MARKUP = ["[/x]", "[red]x[/red]", "[bold]", ":smile:"]


@pytest.fixture
def site(tmp_path: Path, db_url: str, store: SQLAlchemyQueueStore) -> Path:
    """An initialised site-a database and its config file."""
    cfg = write_config(tmp_path, db_url)
    ok("init-db", "--config", cfg)
    return cfg


def shown(*args: str | Path) -> str:
    """The command's output on a terminal wide enough that no cell wraps."""
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def in_order(text: str, parts: list[str]) -> None:
    """Every part is shown as it is, in this order."""
    found = [text.find(p) for p in parts]
    assert -1 not in found, (parts, text)
    assert found == sorted(found), text


def test_browse_shows_payloads_verbatim(site: Path, store: SQLAlchemyQueueStore) -> None:
    transmit(store, "policy", [(m.encode(), ["site-b"]) for m in MARKUP])
    store.recv.apply_log_batch(
        "site-x",
        "policy",
        [
            WireEntry(position=p, type=ReplicationType.LOG_ENTRY_SYNC, payload=m.encode())
            for p, m in enumerate(MARKUP, start=1)
        ],
    )
    untagged = shown("browse", "--config", site, "LRQ_Send_LogEntries")
    in_order(untagged, MARKUP)
    tagged = shown(
        "browse", "--config", site, "LRQ_Send_LogEntries", "--tag", "lrq_logentry_site-b"
    )
    in_order(tagged, ["LRQ_Send_LogEntries [lrq_logentry_site-b]", *MARKUP])
    received = shown("browse", "--config", site, "LRQ_Recv_policy__site-x")
    in_order(received, MARKUP)


def test_snapshot_list_shows_reasons_verbatim(site: Path, store: SQLAlchemyQueueStore) -> None:
    streams = [("site-b", "policy"), ("site-b", "inventory"), ("site-c", "policy")]
    reasons = ["[/x] stalled", "[red]x[/red] failed", "[bold] :smile: asked"]
    ids = [
        store.snapshots.request_snapshot(None, d, c, r)
        for (d, c), r in zip(streams, reasons, strict=True)
    ]
    assert ids[2] == ids[0]  # site-c joined site-b's snapshot of policy: one line each
    text = shown("snapshot", "list", "--config", site)
    for (dest, _), snapshot_id, reason in zip(streams, ids, reasons, strict=True):
        (line,) = [x for x in text.splitlines() if snapshot_id[:8] in x and dest in x]
        assert line.rstrip().endswith(reason), line


def test_status_shows_errors_and_reasons_verbatim(
    site: Path,
    store: SQLAlchemyQueueStore,
) -> None:
    transmit(store, "inventory", [(b"i1", ["site-b"])])
    assert (
        store.retention.drop_stream("site-b", "inventory", "[/x] over [red]limit[/red]") is not None
    )
    store.inspection.save_session_status(
        "site-c",
        "reconnecting",
        connected=False,
        inflight_batches=0,
        inflight_bytes=0,
        last_error="[/x] [red]boom[/red] [bold] :smile:",
    )
    text = shown("status", "--config", site)
    in_order(
        text, ["site site-a", "[/x] over [red]limit[/red]", "[/x] [red]boom[/red] [bold] :smile:"]
    )


def test_demo_prints_paths_and_messages_verbatim() -> None:
    console = demo_console()
    with console.capture() as out:
        for text in MARKUP:
            console.print(f"kept in /tmp/{text}/lr-demo")
    assert out.get().splitlines() == [f"kept in /tmp/{text}/lr-demo" for text in MARKUP]
