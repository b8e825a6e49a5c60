"""Per-stage latency of a hop (:mod:`lr_client.latency`), over gRPC on loopback: the
source's session records where its log batches spent their time up to the sink's
acknowledgement, the sink's subscriber the rest, and ``lr status`` shows both."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store.ops.latency import StageLatency
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server import Site
from lr_server.cli import cli
from tests.kit.rig import Recorder
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import wait_for


def _delivered(listener: Recorder) -> int:
    return sum(len(p) for kind, p in listener.events if kind == "log")  # type: ignore[arg-type]


def _stages(rows: list[StageLatency]) -> dict[str, StageLatency]:
    return {r.stage: r for r in rows if r.client_name == "policy"}


def _status(config: Path) -> tuple[str, dict[str, object]]:
    runner = CliRunner()
    text = runner.invoke(cli, ["status", "--config", str(config)])
    shown = runner.invoke(cli, ["status", "--config", str(config), "--json"])
    assert text.exit_code == 0 and shown.exit_code == 0, (text.output, shown.output)
    return text.stdout, json.loads(shown.stdout)


def test_each_stage_of_a_hop_is_recorded_and_shown(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    port = free_port()
    sink_cfg = write_config(tmp_path, SiteSpec("b", db_url_factory("b"), port, sources=["a"]))
    src_cfg = write_config(tmp_path, SiteSpec("a", db_url_factory("a"), destinations=[("b", port)]))
    with Site(sink_cfg) as sink, Site(src_cfg) as source:
        client = RoutingQueueClient(source.store, "a", "policy")
        for n in range(5):
            with Session(source.store.engine) as s, s.begin():
                client.transmit_log_entry_message(s, b"e%d" % n, ["b"])
        # The source: queued (transmit -> read), sent (read -> send), stored (-> ack).
        wait_for(
            lambda: (
                set(_stages(source.store.latency.list_stage_latency()))
                == {"queued", "sent", "stored"}
            ),
            what="the source's stages recorded",
        )
        at_source = _stages(source.store.latency.list_stage_latency())
        assert all(r.peer == "b" and r.batches >= 1 for r in at_source.values())
        assert all(0 <= r.p50 <= r.p99 <= r.max for r in at_source.values())
        observed = REGISTRY.get_sample_value(
            "lr_stage_latency_seconds_count",
            {"destination": "b", "client": "policy", "stage": "stored"},
        )
        assert observed is not None and observed >= 1
        # The sink: applied (stored in the receive queue -> the delivery's commit).
        listener = Recorder()
        with RoutingQueueSubscriber(sink.store, "policy", listener) as sub:
            wait_for(lambda: sub.poll_once() >= 0 and _delivered(listener) == 5)
        (applied,) = _stages(sink.store.latency.list_stage_latency()).values()
        assert (applied.peer, applied.stage) == ("a", "applied") and applied.batches >= 1
        text, shown = _status(src_cfg)
        assert "latency per stage" in text and "queued" in text and "stored" in text
        rows = shown["stage_latency"]
        assert isinstance(rows, list)
        assert {(r["peer"], r["stage"]) for r in rows} == {
            ("b", "queued"),
            ("b", "sent"),
            ("b", "stored"),
        }
        text, shown = _status(sink_cfg)
        assert "applied" in text
        assert [(r["peer"], r["stage"]) for r in shown["stage_latency"]] == [("a", "applied")]
