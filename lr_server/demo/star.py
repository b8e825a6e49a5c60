"""``lr demo``: four sites replicating on embedded SQLite, as real ``lr server`` processes.

Site ``a`` runs an application that changes its own tables and, in the same
transactions, transmits each change: ``orders`` to ``b`` and/or ``c``
(overlapping destination lists, chosen by key) and ``catalog`` to ``d``.
``d`` joins late: it gets a full sync of the catalog (a PySpark job when Java
and PySpark are available, an in-process provider otherwise) and then the
log entries that followed. Listeners at ``b``, ``c`` and ``d`` apply what
they receive to their own tables; the demo ends with a table and a check
that every sink holds exactly what it should (exit code 1 if not).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.text import Text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotContext, SnapshotProviderRunner
from lr_client.store import QueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.demo.sites import (
    ApplyListener,
    Site,
    catalog,
    check_cell,
    demo_progress,
    encode,
    orders,
    report_check,
    rows,
    run_in_workdir,
    start_server,
    stop_servers,
    summary_table,
    upsert,
    wait_caught_up,
)
from spark_jobs.demo import CATALOG_SOURCE, SOURCE_DB_ENV, spark_available


def order_destinations(key: int) -> list[str]:
    """Overlapping destination lists: a third to b and c, a third to each."""
    return [["b", "c"], ["b"], ["c"]][key % 3]


def spark_skipped_notice(reason: str) -> Text:
    """The line the demo prints when site d's full sync cannot be a Spark job."""
    return Text(
        f"Spark full sync skipped: {reason}. "
        "Site d gets its full sync from an in-process provider instead.",
        style="yellow",
    )


def _config(
    site: Site, dests: list[tuple[Site, list[str]]], sources: list[str], spark: bool
) -> str:
    lines = [
        "[site]",
        f'id = "{site.id}"',
        f'database_url = "{site.url}"',
    ]
    if site.port:
        lines.append(f'listen = "127.0.0.1:{site.port}"')
    lines += [
        "[security]",
        "# Loopback demo: plaintext must be chosen explicitly; use TLS between real sites.",
        'transport = "plaintext"',
        'client_auth = "token"',
        f'token = "demo-token-{site.id}"',
        "[replication]",
        "poll_interval = 0.02",
        "[retry]",
        "initial_backoff = 0.2",
        "max_backoff = 1.0",
        "[retention]",
        "trim_interval = 0.5",
        "[[clients]]",
        'name = "orders"',
        "[[clients]]",
        'name = "catalog"',
        f'snapshot = "{"spark" if spark else "app"}"',
    ]
    if spark:
        lines += [
            f'spark_source = "{CATALOG_SOURCE}"',
            'spark_master = "local[2]"',
        ]
    for dest, clients in dests:
        lines += [
            "[[destinations]]",
            f'id = "{dest.id}"',
            f'address = "127.0.0.1:{dest.port}"',
            "clients = [" + ", ".join(f'"{c}"' for c in clients) + "]",
        ]
    for src in sources:
        lines += ["[[sources]]", f'id = "{src}"', f'token = "demo-token-{src}"']
    return "\n".join(lines) + "\n"


class Demo:
    def __init__(self, console: Console, workdir: Path, transactions: int, duration: float) -> None:
        self.console = console
        self.workdir = workdir
        self.transactions = transactions
        self.duration = duration
        self.spark, self.spark_reason = spark_available()
        self.sites = {name: Site(name, workdir / f"{name}.db") for name in "abcd"}
        for name in "bcd":
            self.sites[name].reserve_port()
        self.stores: dict[str, QueueStore] = {}
        self.engines: dict[str, Engine] = {}  # the applications' own tables
        self.listeners = {"b": ApplyListener(orders), "c": ApplyListener(orders)}
        self.listeners["d"] = ApplyListener(catalog)
        self.sent = {"b": 0, "c": 0, "d": 0}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self._synced_at: float | None = None

    # -- processes --------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[SOURCE_DB_ENV] = str(self.sites["a"].db)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        return env

    def _start(self, site: Site) -> None:
        start_server(site, self.workdir, self._env())

    # -- setup ------------------------------------------------------------------------------
    def setup(self) -> None:
        s = self.sites
        s["a"].config = self.workdir / "a.toml"
        s["a"].config.write_text(
            _config(
                s["a"],
                [(s["b"], ["orders"]), (s["c"], ["orders"]), (s["d"], ["catalog"])],
                [],
                self.spark,
            )
        )
        for name in "bcd":
            path = s[name].config = self.workdir / f"{name}.toml"
            path.write_text(_config(s[name], [], ["a"], self.spark))
        for name, site in s.items():
            self.engines[name], self.stores[name] = site.open()
        self.stores["a"].sites.register_sites(["b", "c", "d"])

    def _loop(self, target: Any) -> None:
        t = threading.Thread(target=target.run, args=(self.stop,), daemon=True)
        t.start()
        self.threads.append(t)

    # -- the application at a ---------------------------------------------------------------
    def _write(self, progress: Progress, task: Any) -> None:
        store = self.stores["a"]
        order_client = RoutingQueueClient(store, source_id="a", client_name="orders")
        catalog_client = RoutingQueueClient(store, source_id="a", client_name="catalog")
        pace = self.duration / max(1, self.transactions)
        start = time.monotonic()
        late_join = int(self.transactions * 0.4)
        i, stop_at = 0, self.transactions
        deadline = start + self.duration + 120
        while i < stop_at or not self._d_synced(stop_at):
            if i >= stop_at and time.monotonic() > deadline:
                break
            if i == self.transactions:
                progress.console.log("the application keeps writing until d's full sync is done")
            if i >= self.transactions:
                progress.update(task, total=i + 1)
            if i == late_join:
                self._start(self.sites["d"])
                progress.console.log("site d joins late: it will get a full sync of the catalog")
            key = i % 500
            dests = order_destinations(key)
            with Session(self.engines["a"]) as session, session.begin():
                upsert(session, orders, f"o{key}", i)
                order_client.transmit_log_entry_message(session, encode(f"o{key}", i), dests)
                if i % 2 == 0:
                    ckey = f"c{(i // 2) % 300}"
                    upsert(session, catalog, ckey, i)
                    catalog_client.transmit_log_entry_message(session, encode(ckey, i), ["d"])
            for d in dests:
                self.sent[d] += 1
            if i % 2 == 0:
                self.sent["d"] += 1
            progress.update(task, completed=i + 1)
            behind = start + (i + 1) * pace - time.monotonic()
            if behind > 0:
                time.sleep(behind)
            i += 1
        progress.update(task, total=i, completed=i)

    def _d_synced(self, stop_at: int) -> bool:
        """True once d's full sync is complete (then a few more changes follow it)."""
        if self._synced_at is None:
            done = self.stores["a"].snapshots.list_snapshots(
                "d", "catalog", [SnapshotStatus.COMPLETED]
            )
            if not done:
                return False
            self._synced_at = time.monotonic()
        return time.monotonic() - self._synced_at > 2.0

    def _expected(self) -> dict[str, dict[str, int]]:
        a_orders = rows(self.engines["a"], orders)
        return {
            "b": {k: v for k, v in a_orders.items() if "b" in order_destinations(int(k[1:]))},
            "c": {k: v for k, v in a_orders.items() if "c" in order_destinations(int(k[1:]))},
            "d": rows(self.engines["a"], catalog),
        }

    def _actual(self) -> dict[str, dict[str, int]]:
        return {
            "b": rows(self.engines["b"], orders),
            "c": rows(self.engines["c"], orders),
            "d": rows(self.engines["d"], catalog),
        }

    def _caught_up(self) -> int:
        expected, actual = self._expected(), self._actual()
        return sum(expected[s] == actual[s] for s in "bcd")

    # -- run --------------------------------------------------------------------------------
    def run(self) -> bool:
        c = self.console
        if not self.spark:
            c.print(spark_skipped_notice(self.spark_reason))
        self.setup()
        c.print(f"Four sites in {self.workdir} (SQLite, loopback gRPC)")
        for name in "bca":
            self._start(self.sites[name])
        for name in "bcd":
            self._loop(
                RoutingQueueSubscriber(
                    self.stores[name],
                    "catalog" if name == "d" else "orders",
                    self.listeners[name],
                    poll_interval=0.05,
                )
            )
        if not self.spark:
            a = self.stores["a"]
            self._loop(SnapshotProviderRunner(a, "catalog", self._provide_catalog))
        t0 = time.monotonic()
        with demo_progress(c) as progress:
            write = progress.add_task("a: transactions", total=self.transactions)
            self._write(progress, write)
            wait_caught_up(progress, "sinks caught up", 3, self._caught_up)
        elapsed = time.monotonic() - t0
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        ok = self._report(elapsed)
        stop_servers(self.sites.values())
        for store in self.stores.values():
            store.close()
        return ok

    def _provide_catalog(self, ctx: SnapshotContext) -> None:
        ctx.transmit(encode(k, v) for k, v in sorted(rows(self.engines["a"], catalog).items()))

    def _report(self, elapsed: float) -> bool:
        expected, actual = self._expected(), self._actual()
        a = self.stores["a"]
        table = summary_table(
            "Replication summary",
            [
                ("site", "left"),
                ("client", "left"),
                ("sent", "right"),
                ("applied", "right"),
                ("lag", "right"),
                ("snap rows", "right"),
                ("entries/s", "right"),
                ("check", "left"),
            ],
        )
        ok = True
        for name, client in (("b", "orders"), ("c", "orders"), ("d", "catalog")):
            listener = self.listeners[name]
            lag = a.shipping.backlog(name, client).entries
            match = expected[name] == actual[name]
            ok &= match
            snaps = [
                x for x in a.snapshots.list_snapshots(name, client) if x.entry_count is not None
            ]
            snap_rows = sum(x.entry_count or 0 for x in snaps)
            table.add_row(
                name,
                client,
                str(self.sent[name]),
                str(listener.applied),
                str(lag),
                str(snap_rows) if snaps else "-",
                f"{(listener.applied + listener.snapshot_rows) / elapsed:,.0f}",
                check_cell(actual[name], match),
            )
        self.console.print(table)
        how = "PySpark job" if self.spark else "in-process provider"
        self.console.print(
            f"Full sync of d by {how}; log entries applied after it. Elapsed {elapsed:.1f}s."
        )
        report_check(self.console, ok, "All sinks match their source.", expected, actual)
        return ok


def run_demo(transactions: int = 2000, duration: float = 20.0, keep: bool = False) -> int:
    """Run the demo; returns the process exit code."""

    def demo(console: Console, workdir: Path) -> bool:
        return Demo(console, workdir, transactions, duration).run()

    return run_in_workdir("lr-demo-", demo, keep)
