"""``lr demo --topology tree``: a cascaded client down a tree of real ``lr server`` processes.

Site ``a`` is the root of the cascaded client ``orders``: its application
changes its ``demo_orders`` table and, in the same transactions, transmits
each change to the nodes of the set. Branch ``b`` receives the entries,
applies them and relays them from its own receive queue to the leaves ``c``
and ``d``. Half-way through, while the application keeps writing, the
operator moves leaf ``d`` from ``b`` to ``a`` with ``lr provider switch
--client orders --to a``: ``a`` adopts ``d`` and resumes it after the last
entry it had from ``b``, with no full sync. The demo ends with a table (node,
role, provider, rows, full syncs) and a check that every node holds exactly
what ``a`` transmitted and that the switch needed no full sync (exit code 1
if not). Each node runs on embedded SQLite, as in ``lr demo``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.records import CascadeChild
from lr_client.store import QueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.demo.sites import (
    ApplyListener,
    Site,
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

CLIENT = "orders"
ROOT = "a"
#: Node -> its provider as configured (the same ``[cascade.orders]`` table on every node).
TREE = {"b": "a", "c": "b", "d": "b"}
NODES = ("b", "c", "d")
#: The leaf moved to the root half-way through the run.
SWITCHED, SWITCH_TO = "d", "a"


class CountingListener(ApplyListener):
    """Applies the orders and counts the full syncs it was given."""

    def __init__(self) -> None:
        super().__init__(orders)
        self.full_syncs = 0

    def on_full_sync_start(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        self.full_syncs += 1


def _tree_config(site: Site, ports: dict[str, int]) -> str:
    """A node's TOML: its children (and, at the root, the leaf it will adopt) as
    destinations; its provider (and at ``d`` the root it moves to) and its children as
    sources with their addresses (a node reports to its provider there)."""
    lines = [
        "[site]",
        f'id = "{site.id}"',
        f'database_url = "{site.url}"',
        f'listen = "127.0.0.1:{site.port}"',
        "[security]",
        "# Loopback demo: plaintext must be chosen explicitly; use TLS between real sites.",
        'transport = "plaintext"',
        'client_auth = "token"',
        # One token for the set: each node presents it to the others and expects it of them.
        'token = "demo-token-tree"',
        "[replication]",
        "poll_interval = 0.02",
        "cascade_report_interval = 0.25",
        "[retry]",
        "initial_backoff = 0.2",
        "max_backoff = 1.0",
        "[retention]",
        "trim_interval = 0.5",
        "[[clients]]",
        f'name = "{CLIENT}"',
    ]
    dests = sorted(n for n, p in TREE.items() if p == site.id)
    if site.id == SWITCH_TO:
        dests.append(SWITCHED)
    for dest in dests:
        lines += [
            "[[destinations]]",
            f'id = "{dest}"',
            f'address = "127.0.0.1:{ports[dest]}"',
            f'clients = ["{CLIENT}"]',
        ]
    # Its provider sends it entries; its children report to it.
    sources = [TREE[site.id]] if site.id in TREE else []
    sources += dests
    if site.id == SWITCHED:
        sources.append(SWITCH_TO)
    for src in sources:
        lines += [
            "[[sources]]",
            f'id = "{src}"',
            'token = "demo-token-tree"',
            f'address = "127.0.0.1:{ports[src]}"',
        ]
    nodes = ", ".join(f'{n} = "{p}"' for n, p in sorted(TREE.items()))
    lines += [f"[cascade.{CLIENT}]", f'root = "{ROOT}"', f"nodes = {{ {nodes} }}"]
    return "\n".join(lines) + "\n"


class TreeDemo:
    """Runs the tree; :meth:`run` returns whether every node matched."""

    def __init__(self, console: Console, workdir: Path, transactions: int, duration: float) -> None:
        self.console = console
        self.workdir = workdir
        self.transactions = transactions
        self.duration = duration
        self.sites = {name: Site(name, workdir / f"{name}.db") for name in (ROOT, *NODES)}
        for site in self.sites.values():
            site.reserve_port()
        self.stores: dict[str, QueueStore] = {}
        self.engines: dict[str, Engine] = {}
        self.listeners = {name: CountingListener() for name in NODES}
        self.sent = 0
        self.switch: dict[str, Any] = {}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def setup(self) -> None:
        ports = {name: site.port for name, site in self.sites.items()}
        for name, site in self.sites.items():
            site.config = self.workdir / f"{name}.toml"
            site.config.write_text(_tree_config(site, ports))
            self.engines[name], self.stores[name] = site.open()
        self.stores[ROOT].sites.register_sites(list(NODES))

    # -- the operator ---------------------------------------------------------------------------
    def _switch(self, log: Any) -> None:
        """``lr provider switch`` at the leaf, as an operator runs it."""
        site = self.sites[SWITCHED]
        cmd = ["provider", "switch", "--config", str(site.config), "--client", CLIENT]
        cmd += ["--to", SWITCH_TO, "--json"]
        log(f"operator at {SWITCHED}: lr {' '.join(cmd[:2])} --client {CLIENT} --to {SWITCH_TO}")
        done = subprocess.run(
            [sys.executable, "-m", "lr_server.cli", *cmd],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        try:
            self.switch = json.loads(done.stdout)
        except ValueError:
            self.switch = {
                "error": (done.stdout + done.stderr).strip() or f"exit {done.returncode}"
            }
        if done.returncode == 0:
            log(
                f"{SWITCHED}: provider {self.switch['previous_provider']} -> {SWITCH_TO} "
                f"(epoch {self.switch['epoch']}); {SWITCH_TO} adopted it"
            )
        else:
            log(f"the switch failed (exit {done.returncode}): {self.switch.get('error')}")

    # -- the application at the root ------------------------------------------------------------
    def _write(self, progress: Progress, task: Any) -> None:
        """Paced transactions; half-way the operator switches ``d`` (in a thread: the
        application keeps writing), and the application goes on until a tenth of the
        run's transactions followed the switch, so the old provider hears of it."""
        client = RoutingQueueClient(self.stores[ROOT], source_id=ROOT, client_name=CLIENT)
        pace = self.duration / self.transactions
        start = time.monotonic()
        operator = threading.Thread(target=self._switch, args=(progress.console.log,), daemon=True)
        half, after = self.transactions // 2, max(10, self.transactions // 10)
        switched_at: int | None = None
        i, deadline = 0, start + self.duration + 120
        while True:
            if i == half:
                operator.start()
            if switched_at is None and i > half and not operator.is_alive():
                switched_at = i
            if i >= self.transactions and switched_at is not None and i >= switched_at + after:
                break
            if time.monotonic() > deadline:
                break
            if i >= self.transactions:
                progress.update(task, total=i + 1)
            key = f"o{i % 500}"
            with Session(self.engines[ROOT]) as session, session.begin():
                upsert(session, orders, key, i)
                # A cascaded client is addressed to the nodes of its set.
                client.transmit_log_entry_message(session, encode(key, i), list(NODES))
            self.sent += 1
            progress.update(task, completed=i + 1)
            behind = start + (i + 1) * pace - time.monotonic()
            if behind > 0:
                time.sleep(behind)
            i += 1
        operator.join(timeout=90)
        progress.update(task, total=i, completed=i)

    def _matches(self) -> dict[str, bool]:
        expected = rows(self.engines[ROOT], orders)
        return {n: rows(self.engines[n], orders) == expected for n in NODES}

    def run(self) -> bool:
        c = self.console
        self.setup()
        c.print(
            f"A tree of four sites in {self.workdir} (SQLite, loopback gRPC): "
            f"{ROOT} -> b -> c, d; {SWITCHED} moves to {SWITCH_TO} half-way"
        )
        for name in ("c", "d", "b", ROOT):
            start_server(self.sites[name], self.workdir)
        for name in NODES:
            sub = RoutingQueueSubscriber(
                self.stores[name], CLIENT, self.listeners[name], poll_interval=0.05
            )
            t = threading.Thread(target=sub.run, args=(self.stop,), daemon=True)
            t.start()
            self.threads.append(t)
        t0 = time.monotonic()
        with demo_progress(c) as progress:
            write = progress.add_task(f"{ROOT}: transactions", total=self.transactions)
            self._write(progress, write)
            wait_caught_up(
                progress, "nodes caught up", len(NODES), lambda: sum(self._matches().values())
            )
        elapsed = time.monotonic() - t0
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        ok = self._report(elapsed)
        stop_servers(self.sites.values())
        for store in self.stores.values():
            store.close()
        return ok

    def _child(self, provider: str) -> CascadeChild | None:
        """The switched leaf as ``provider`` knows it (None: not a child there)."""
        children = self.stores[provider].cascade.cascade_children(CLIENT)
        return next((r for r in children if r.child_id == SWITCHED), None)

    def _report(self, elapsed: float) -> bool:
        expected = rows(self.engines[ROOT], orders)
        table = summary_table(
            f"Cascade of {CLIENT}",
            [
                ("node", "left"),
                ("role", "left"),
                ("provider", "left"),
                ("applied", "right"),
                ("rows", "right"),
                ("full syncs", "right"),
                ("check", "left"),
            ],
        )
        root = self.stores[ROOT].cascade.cascade_node(CLIENT)
        table.add_row(
            ROOT, root.role if root else "?", "-", "-", str(len(expected)), "-", f"{self.sent} sent"
        )
        ok = True
        actual = {n: rows(self.engines[n], orders) for n in NODES}
        for name in NODES:
            node = self.stores[name].cascade.cascade_node(CLIENT)
            listener = self.listeners[name]
            match = actual[name] == expected
            ok &= match and listener.full_syncs == 0
            provider = f"{node.provider_id} (epoch {node.epoch})" if node else "?"
            table.add_row(
                name,
                node.role if node else "?",
                provider,
                str(listener.applied),
                str(len(actual[name])),
                str(listener.full_syncs),
                check_cell(actual[name], match),
            )
        self.console.print(table)
        switched = self.stores[SWITCHED].cascade.cascade_node(CLIENT)
        moved = switched is not None and switched.provider_id == SWITCH_TO
        adopted = self._child(SWITCH_TO)
        left = self._child(TREE[SWITCHED])
        ok &= (
            moved
            and bool(self.switch.get("adopted"))
            and adopted is not None
            and not adopted.dropped
        )
        self.console.print(
            f"{SWITCH_TO} lists {SWITCHED} as its child "
            + (f"at epoch {adopted.epoch}" if adopted is not None else "- not at all")
            + f"; {TREE[SWITCHED]} "
            + ("was refused and let it go" if left is None or left.dropped else "still holds it")
            + "."
        )
        syncs = self.listeners[SWITCHED].full_syncs
        self.console.print(
            f"{SWITCHED} moved from {TREE[SWITCHED]} to {SWITCH_TO} mid-run "
            + ("with no full sync" if moved and syncs == 0 else "(see the table)")
            + f". Elapsed {elapsed:.1f}s."
        )
        success = "Every node holds what the root transmitted."
        report_check(self.console, ok, success, {n: expected for n in NODES}, actual)
        return ok


def run_tree_demo(transactions: int = 2000, duration: float = 20.0, keep: bool = False) -> int:
    """Run the tree demo; returns the process exit code."""

    def demo(console: Console, workdir: Path) -> bool:
        return TreeDemo(console, workdir, transactions, duration).run()

    return run_in_workdir("lr-demo-tree-", demo, keep)


__all__ = ["TreeDemo", "run_tree_demo"]
