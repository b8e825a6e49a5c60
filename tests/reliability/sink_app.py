"""The sink application as a process: subscribers applying with the recording listener.

Runs one :class:`~lr_client.RoutingQueueSubscriber` per ``--client`` (threads),
each applying with :class:`tests.kit.traffic.RecordingListener`, until SIGTERM
(clean stop: leases released) or SIGKILL (the tests' fault). Writes
``--ready`` once its tables exist. SIGUSR1 writes every thread's stack to its
output (:meth:`tests.reliability.harness.SinkProc.stop` asks for it when a stop
is slow).
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lr_client.errors import SchemaError, StoreUnavailableError  # noqa: E402
from lr_client.store import open_store  # noqa: E402
from lr_server.ops.stop_signals import stop_on_signals  # noqa: E402
from tests.kit.traffic import SinkApp  # noqa: E402
from tests.kit.wait import Deadline  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--client", action="append", default=[])
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--partitions", type=int, default=1, help="deliver by partition")
    args = parser.parse_args(argv)

    stop = threading.Event()
    stop_on_signals(stop, [signal.SIGTERM])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    wait_for_schema(args.url, stop)
    app = SinkApp(
        args.url,
        args.client or ["policy"],
        batch_size=args.batch_size,
        lease_seconds=args.lease_seconds,
        partitions=args.partitions,
    )
    try:
        app.start()
        if args.ready:
            args.ready.write_text("ready")
        stop.wait()
    finally:
        app.close()
    return 0


def wait_for_schema(url: str, stop: threading.Event, timeout: float = 60.0) -> None:
    """The sink's ``lr server`` creates the queue schema: wait for it rather than race it."""
    store = open_store(url)
    deadline = Deadline(timeout)
    try:
        while not stop.is_set():
            try:
                store.check_schema()
                return
            except (SchemaError, StoreUnavailableError):
                if deadline.expired():
                    raise
                stop.wait(0.1)
    finally:
        store.engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
