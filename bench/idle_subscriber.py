"""A sink application for ``bench/idle.py``: one subscriber per client, at its defaults.

    python -m bench.idle_subscriber --url DATABASE_URL --clients c-1,c-2

Each client gets a :class:`lr_client.RoutingQueueSubscriber` with its default settings
(poll interval, wake on arrival) over one engine, running in its own thread with a
listener that accepts whatever it is given. Prints ``ready`` once every subscriber
runs, and stops on SIGTERM or SIGINT. :class:`Subscriber` starts one and stops it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy.orm import Session  # noqa: E402

from lr_client import (  # noqa: E402
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
    create_engine,
)
from tests.kit.procs import ROOT as KIT_ROOT  # noqa: E402
from tests.kit.procs import lr_env, tail  # noqa: E402


class Accept(RoutingQueueListener):
    """Takes every batch (an idle benchmark expects none)."""

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


@dataclass
class Subscriber:
    """A subscriber process of one sink (:mod:`bench.idle_subscriber`)."""

    name: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, name: str, url: str, clients: Sequence[str], workdir: Path) -> Subscriber:
        log_path = workdir / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.idle_subscriber", "--url", url,
                 "--clients", ",".join(clients)],
                stdout=log, stderr=subprocess.STDOUT, env=lr_env(), cwd=KIT_ROOT,
            )  # fmt: skip
        return cls(name, log_path, proc)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"subscriber {self.name} exited:\n{tail(self.log_path)}")
        return "ready" in tail(self.log_path, 2000).split()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--clients", required=True, help="client names, comma-separated")
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    engine = create_engine(args.url)
    subscribers = [
        RoutingQueueSubscriber(engine, client_name=c, listener=Accept())
        for c in args.clients.split(",")
    ]
    threads = [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in subscribers]
    for t in threads:
        t.start()
    print("ready", flush=True)
    stop.wait()
    for t in threads:
        t.join(timeout=30)
    for s in subscribers:
        s.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
