"""``lr status``: where every stream stands, read by :func:`lr_server.admin.status`, shown as
tables."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_client.latency import STAGES
from lr_server.cli.database import open_site_store
from lr_server.cli.options import config_option, json_option
from lr_server.cli.parked import render_failures
from lr_server.cli.render import (
    ago,
    console,
    human_bytes,
    human_seconds,
    print_json,
    short_id,
    shorten,
    table,
)
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_client.store.ops.latency import StageLatency
    from lr_client.store.recv.replay_contract import ReplayRequest
    from lr_server.ops.status_records import SiteStatus


@click.command()
@config_option
@json_option
def status(config_path: Path, as_json: bool) -> None:
    """Where every stream stands: lag, state, acks, in-flight, snapshots, drops, replays,
    and where a hop's batches spend their time (latency per stage)."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        report = admin.status(config, store)
        blocked, parked = admin.blocked_queues(store), admin.parked_counts(store)
        replays = admin.list_replays(store)
        stages = store.latency.list_stage_latency()
    if as_json:
        extra = {
            "blocked_queues": [b.to_dict() for b in blocked],
            "parked_entries": [p.to_dict() for p in parked],
            "replays": [r.to_dict() for r in replays],
            "stage_latency": [x.to_dict() for x in stages],
        }
        print_json({**report.to_dict(), **extra})
    else:
        render_status(report)
        render_failures(blocked, parked, report.time)
        render_replays(replays)
        render_stages(stages, report.time)


def render_stages(rows: list[StageLatency], now: float) -> None:
    """Print where the hops' batches spend their time (``lrq_stage_latency``), if known:
    per peer (a destination here, or a source) and client, each stage's last batches."""
    if not rows:
        return
    order = {stage: i for i, stage in enumerate(STAGES)}
    t = table(
        "latency per stage", "peer", "client", "stage", "batches", "p50", "p99", "max", "as of"
    )
    for r in sorted(rows, key=lambda r: (r.peer, r.client_name, order.get(r.stage, len(order)))):
        t.add_row(
            r.peer,
            r.client_name,
            r.stage,
            str(r.batches),
            millis(r.p50),
            millis(r.p99),
            millis(r.max),
            ago(r.updated_at, now),
        )
    console().print(t)


def millis(sec: float) -> str:
    """A short duration in milliseconds (longer ones as :func:`human_seconds`)."""
    return f"{sec * 1000:.1f} ms" if sec < 10 else human_seconds(sec)


def render_replays(replays: list[ReplayRequest]) -> None:
    """Print the open replay requests (``lr replay``), if any."""
    if not replays:
        return
    t = table("replays", "id", "dest", "client", "from", "through", "acked", "status")
    for r in replays:
        through = "-" if r.through_position is None else str(r.through_position)
        t.add_row(
            str(r.replay_id),
            r.destination,
            r.client_name,
            str(r.from_position),
            through,
            str(r.shipped_through),
            r.status,
        )
    console().print(t)


def render_status(report: SiteStatus) -> None:
    """Print the report as tables: send streams, snapshots, slots, drops, stops, sessions,
    sink streams, drop notices and cascades (the tables with no rows left out)."""
    from rich.text import Text

    from lr_server.ops.status_records import StreamState

    out = console()
    now = report.time
    oldest = "-" if report.oldest_position is None else str(report.oldest_position)
    out.print(
        Text.assemble(
            (f"site {report.site}", "bold"),
            f"  head position {report.head_position}, oldest stored {oldest}",
        )
    )
    if report.send:
        # The owner column when several members share the streams (always in --json).
        owners = len({x.owner for x in report.send if x.owner}) > 1
        columns = ["dest", "client", "state", "lag", "bytes", "age", "ack", "in-fl"]
        t = table("send streams", *columns, *(["owner"] if owners else []))
        for x in report.send:
            t.add_row(
                x.destination + ("" if x.configured else "*"),
                x.client,
                x.state,
                str(x.lag_entries) + ("!" if x.slow and x.state != StreamState.DROPPED else ""),
                human_bytes(x.lag_bytes),
                human_seconds(x.lag_seconds),
                ago(x.last_ack, now),
                "-" if x.inflight_batches is None else str(x.inflight_batches),
                *([x.owner or "-"] if owners else []),
            )
        out.print(t)
    snaps = [x for x in report.send if x.snapshot]
    if snaps:
        t = table("open snapshots", "dest", "client", "id", "status", "rows", "base")
        for x in snaps:
            assert x.snapshot is not None
            total = "?" if x.snapshot.rows_total is None else str(x.snapshot.rows_total)
            t.add_row(
                x.destination,
                x.client,
                short_id(x.snapshot.snapshot_id),
                x.snapshot.state.value,
                f"{x.snapshot.rows_written}/{total}",
                "-" if x.snapshot.base_position is None else str(x.snapshot.base_position),
            )
        out.print(t)
    if report.slots:
        t = table("queue slots (retired whole)", "queue", "slots", "current", "stored", "size")
        for queue in ("send", "receive"):
            mine = [x for x in report.slots if x.queue == queue]
            if mine:
                t.add_row(
                    queue,
                    str(len(mine)),
                    ",".join(str(x.slot) for x in mine if x.current),
                    str(sum(x.entries for x in mine)),
                    human_bytes(sum(x.bytes for x in mine)),
                )
        out.print(t)
    drops = [x for x in report.send if x.drop]
    if drops:
        t = table("dropped (full sync on return)", "dest", "client", "from pos", "when", "reason")
        for x in drops:
            assert x.drop is not None
            t.add_row(
                x.destination,
                x.client,
                str(x.drop.first_dropped_position),
                ago(x.drop.dropped_at, now),
                x.drop.reason,
            )
        out.print(t)
    stops = [x for x in report.send if x.stop]
    if stops:
        t = table(
            "stopped streams (lr accept-loss to resume) and accepted losses",
            "dest",
            "client",
            "resume after",
            "since",
            "reason",
        )
        for x in stops:
            assert x.stop is not None
            t.add_row(
                x.destination,
                x.client,
                str(x.stop.resume_after) + (" (accepted)" if x.stop.accepted else ""),
                ago(x.stop.stopped_at, now),
                Text(x.stop.reason),
            )
        out.print(t)
    if report.sessions:
        t = table("sessions", "dest", "state", "conn", "in-flight", "updated", "last error")
        for s in report.sessions:
            t.add_row(
                s.destination,
                s.state,
                "yes" if s.connected else "no",
                f"{s.inflight_batches} / {human_bytes(s.inflight_bytes)}",
                ago(s.updated_at, now),
                shorten(s.last_error, 60) or "-",
            )
        out.print(t)
    if report.sink:
        t = table("sink streams", "source", "client", "last pos", "snapshot", "recv", "queued")
        for y in report.sink:
            t.add_row(
                y.source + ("" if y.configured else "*"),
                y.client,
                str(y.last_position),
                y.snapshot_state + (f" {short_id(y.snapshot_id)}" if y.snapshot_id else ""),
                str(y.entries_received),
                str(y.queue_depth),
            )
        out.print(t)
    notices = [y for y in report.sink if y.drop]
    if notices:
        t = table("drop notices received", "source", "client", "from pos", "when", "reason")
        for y in notices:
            assert y.drop is not None
            t.add_row(
                y.source,
                y.client,
                str(y.drop.first_dropped_position),
                ago(y.drop.dropped_at, now),
                Text(y.drop.reason),
            )
        out.print(t)
    if report.cascades:
        t = table("cascades", "client", "origin", "role", "provider", "local wm", "global wm")
        for k in report.cascades:
            t.add_row(
                k.client,
                k.origin,
                k.role,
                f"{k.provider} (epoch {k.epoch})" if k.provider else "-",
                str(k.local_watermark),
                str(k.global_watermark),
            )
        out.print(t)
    kids = [(k.client, c) for k in report.cascades for c in k.children]
    if kids:
        t = table("cascade children", "client", "child", "epoch", "local wm", "acked", "report")
        for client, c in kids:
            state = "" if not c.dropped else (" (left)" if c.counts else " (dropped)")
            t.add_row(
                client,
                c.child_id + state,
                str(c.epoch),
                str(c.local_watermark),
                str(c.acked_position),
                ago(c.reported_at, now),
            )
        out.print(t)
    if not report.send and not report.sink:
        out.print("no streams yet: no destinations, sources or traffic")
    if any(x.slow and x.state != StreamState.DROPPED for x in report.send):
        out.print("! slow: past retention.soft_fraction of a retention limit")
    if any(not x.configured for x in report.send) or any(not y.configured for y in report.sink):
        out.print("* not in this config file")
