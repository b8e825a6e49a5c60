"""Network faults between a sender and a sink: cut, stall, slow, reset (invariant I3).

The source's destination address points at a :class:`~tests.kit.tcp_proxy.FaultProxy`
in front of the sink's gRPC port. Under steady traffic of two clients, each
fault is applied for a while and lifted; replication must resume (a new
connection through the proxy, within the session's backoff) and, at the end,
the verifier must find nothing lost, duplicated or out of order.

Sites run in-process (``SiteServer``, real gRPC on loopback); the stall lasts
longer than ``[replication] stream_idle_timeout = 2``, so the sender gives up
on the silent stream and reconnects.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

from lr_server.config import load_config
from lr_server.server import SiteServer
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config
from tests.kit.tcp_proxy import FaultProxy
from tests.kit.traffic import SinkApp, SourceApp, read_applied, read_sent, read_snapshots
from tests.kit.verifier import Report, verify
from tests.reliability.harness import reliability_seed, trial_count, tune_config

CLIENTS = ("policy", "inventory")
IDLE_TIMEOUT = 2.0


@contextmanager
def proxied_sites(
    tmp_path: Path, make_url: Callable[[str], str]
) -> Iterator[tuple[FaultProxy, SourceApp, SinkApp, SiteServer]]:
    """Sink ``b`` behind a proxy, source ``a`` sending through it; apps on both."""
    port = free_port()
    tune = {
        "replication": {"stream_idle_timeout": IDLE_TIMEOUT, "batch_max_entries": 100},
        "retry": {"initial_backoff": 0.05, "max_backoff": 0.5},
    }
    url_a, url_b = make_url("a"), make_url("b")
    sink_cfg = tune_config(
        write_config(tmp_path, SiteSpec("b", url_b, port=port, sources=["a"], clients=CLIENTS)),
        tune,
    )
    with ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy("127.0.0.1", port))
        source_cfg = tune_config(
            write_config(
                tmp_path, SiteSpec("a", url_a, destinations=[("b", proxy.port)], clients=CLIENTS)
            ),
            tune,
        )
        sink = SiteServer(load_config(sink_cfg))
        sink.start()
        stack.callback(sink.stop)
        source_app = SourceApp(url_a, "a", ["b"], clients=CLIENTS, rate=100, max_batch=3)
        stack.callback(source_app.close)
        sink_app = SinkApp(url_b, CLIENTS).start()
        stack.callback(sink_app.close)
        sender = SiteServer(load_config(source_cfg))
        sender.start()
        stack.callback(sender.stop)
        yield proxy, source_app, sink_app, sender


def check(source: SourceApp, sink: SinkApp) -> Report:
    return verify(
        read_sent(source.engine, "a"),
        read_applied(sink.engine, "b"),
        snapshots=read_snapshots(source.engine, "a"),
        rolled_back=source.rolled_back,
    )


def _grew(sink: SinkApp, count: int) -> bool:
    return applied_count(sink) > count


def observe(
    sender: SiteServer, seconds: float, until: Callable[[set[str]], bool] | None = None
) -> set[str]:
    """The errors the session to ``b`` reports during ``seconds`` (polled): the fault's length.

    With ``until``, the fault lasts until the errors seen satisfy it as well (the
    sender noticed the fault: on a loaded machine that may take longer than ``seconds``).
    """
    seen: set[str] = set()
    started = time.monotonic()

    def over() -> bool:
        error = sender.sessions["b"].last_error
        if error:
            seen.add(error.split(":", 2)[0] + ":" + error.split(":", 2)[1][:60])
        return time.monotonic() - started >= seconds and (until is None or until(seen))

    wait_for(over, seconds + 60, 0.02, what="the sender noticing the fault", detail=lambda: seen)
    return seen


def _noticed_stall(seen: set[str]) -> bool:
    return any("stream_idle_timeout" in e or "DEADLINE" in e for e in seen)


def backlog(sink: SinkApp) -> int:
    """Entries received at the sink and not yet delivered."""
    return sum(sink.store.queues.queue_depth(q.queue_id) for q in sink.store.queues.list_queues())


def applied_count(sink: SinkApp) -> int:
    return len(read_applied(sink.engine, "b"))


def test_cut_stall_slow_and_reset_lose_and_duplicate_nothing(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    seed = reliability_seed()
    rounds = trial_count(1)
    with proxied_sites(tmp_path, db_url_factory) as (proxy, source, sink, sender):
        source.start()
        wait_for(lambda: applied_count(sink) > 20, 30)
        done: list[str] = []
        errors: dict[str, set[str]] = {f: set() for f in ("cut", "stall", "slow", "reset")}
        for r in range(rounds):
            rng = random.Random(f"{seed}/{r}")
            faults = ["cut", "stall", "slow", "reset"]
            rng.shuffle(faults)
            for fault in faults:
                time.sleep(rng.uniform(0.1, 0.6))  # a random moment of steady traffic
                conns = proxy.connections_total
                if fault == "cut":  # connections reset, new ones refused, for a while
                    proxy.cut()
                    errors[fault] |= observe(sender, rng.uniform(0.5, 1.5))
                elif fault == "stall":  # silent, open connections: longer than the idle timeout
                    proxy.stall()
                    errors[fault] |= observe(
                        sender, IDLE_TIMEOUT + rng.uniform(0.5, 1.5), _noticed_stall
                    )
                elif fault == "slow":
                    proxy.slow(rng.choice([8_000, 20_000, 50_000]))
                    errors[fault] |= observe(sender, rng.uniform(1.0, 2.5))
                else:
                    proxy.reset_all()
                    errors[fault] |= observe(sender, 0.3)
                proxy.restore()
                before = applied_count(sink)
                # Replication resumes: more entries applied, and after a cut or a reset a
                # new connection through the proxy (after a stall, gRPC may reuse the old
                # one once it flows again).
                wait_for(partial(_grew, sink, before + 10), 30)
                if fault in ("cut", "reset"):
                    assert proxy.connections_total > conns, fault
                done.append(fault)
        source.stop()
        wait_for(lambda: check(source, sink).lost == 0 and not backlog(sink), 60)
        report = check(source, sink)
        print(f"faults {done} (seed {seed}): {report.counts()}")
        for fault, seen in errors.items():
            print(f"  {fault}: session errors {sorted(seen)}")
        report.assert_clean()
        # The sender noticed the silent stream (or the connection going) and reconnected.
        assert _noticed_stall(errors["stall"]), errors
        assert {k[2] for k in report.streams} == set(CLIENTS)
        assert report.applied == report.expected > 100
        assert not source.errors, source.errors[:5]
