"""An application process that runs the in-process snapshot provider of ``policy``.

It serves every snapshot request of the source database at ``--url`` with the
traffic kit's provider (``--chunk`` rows per transmit, ``--pause`` seconds
between chunks), beating every ``--heartbeat`` seconds, until SIGTERM or
SIGKILL.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import create_engine, open_store
from lr_server.ops.stop_signals import stop_on_signals
from tests.kit.traffic import snapshot_provider


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--pause", type=float, default=0.05)
    p.add_argument("--heartbeat", type=float, default=0.2)
    args = p.parse_args(argv)
    engine = create_engine(args.url)
    store = open_store(engine)
    runner = SnapshotProviderRunner(
        store,
        "policy",
        snapshot_provider(engine, chunk=args.chunk, pause=args.pause),
        heartbeat_interval=args.heartbeat,
    )
    stop = threading.Event()
    stop_on_signals(stop, [signal.SIGTERM])
    runner.run(stop, interval=0.1)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
