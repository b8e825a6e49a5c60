"""A sink site of two receiving members under traffic: kill -9 the one the source talks to.

Sink ``b`` runs two ``lr server`` processes (members ``b-1`` and ``b-2``) on
its one PostgreSQL database, each listening on its own address with its own
metrics port; source ``a`` lists both (``[[destinations]] address`` and
``addresses``). Under steady traffic the member whose ``lr_entries_applied``
grows (the one the source is connected to) is SIGKILLed: the source must
fail over to the other, which then applies entries too, and the verifier
must find nothing lost, duplicated or reordered once the sink drains.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kit.procs import LrServer
from tests.kit.scrape import metric_sum
from tests.kit.sites import free_port
from tests.kit.traffic import SourceApp
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import Deployment, reliability_seed

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)]

CLIENTS = ("policy", "inventory")
TUNE = {"members": {"lease_timeout": 2.0, "heartbeat_interval": 0.25}}


def applied_at(metrics_port: int) -> dict[str, float] | None:
    """client -> entries from source ``a`` a sink member wrote (None: unreachable)."""
    found = {
        c: metric_sum(metrics_port, "lr_entries_applied_total", source="a", client=c)
        for c in CLIENTS
    }
    return None if None in found.values() else {c: v or 0.0 for c, v in found.items()}


def counts(metrics: dict[str, int]) -> dict[str, dict[str, float]]:
    """member -> client -> entries applied (an unreachable member: none)."""
    return {m: applied_at(p) or dict.fromkeys(CLIENTS, 0.0) for m, p in metrics.items()}


def test_source_fails_over_between_sink_members_on_sigkill(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    seed = reliability_seed()
    dep = Deployment(tmp_path, db_url_factory, sinks=("b",), clients=CLIENTS, tune=TUNE)
    listen = {"b-1": dep.ports["b"], "b-2": free_port()}
    metrics = {m: free_port() for m in listen}
    # The source lists both members of b: address (b-1), then addresses (b-2).
    source_config = dep.configs["a"]
    first = f'address = "127.0.0.1:{listen["b-1"]}"'
    text = source_config.read_text()
    assert first in text
    source_config.write_text(
        text.replace(first, f'{first}\naddresses = ["127.0.0.1:{listen["b-2"]}"]', 1)
    )
    for key, member in (("b", "b-1"), ("b#2", "b-2")):
        args = ["--member-id", member, "--listen", f"127.0.0.1:{listen[member]}"]
        args += ["--metrics-port", str(metrics[member])]
        dep.servers[key] = LrServer(dep.configs["b"], args=args, name=member)
    servers = {"b-1": dep.servers["b"], "b-2": dep.servers["b#2"]}
    source = SourceApp(
        dep.raw_urls["a"], "a", ["b"], clients=CLIENTS, seed=seed, rate=80, max_batch=3
    )
    try:
        dep.start()
        servers["b-2"].wait_listening(listen["b-2"])
        for m in metrics:
            wait_for(lambda m=m: applied_at(metrics[m]) is not None, scaled(30), what=m)
        source.start()

        def receiving(base: dict[str, dict[str, float]]) -> tuple[str, str] | None:
            """(member, client) whose applied count grew by 50 since ``base``."""
            now = counts(metrics)
            grown = [(m, c) for m in now for c in CLIENTS if now[m][c] >= base[m][c] + 50]
            return grown[0] if grown else None

        zero = {m: dict.fromkeys(CLIENTS, 0.0) for m in metrics}
        victim, client = wait_for(
            lambda: receiving(zero), scaled(60), 0.1, what="entries applied at a member of b"
        )
        other = "b-2" if victim == "b-1" else "b-1"
        before = counts(metrics)
        dep.events.append(f"kill -9 {victim} (receiving {client})")
        servers[victim].kill()
        # The stream the victim received now goes to the other member.
        wait_for(
            lambda: counts(metrics)[other][client] >= before[other][client] + 50,
            scaled(60),
            0.1,
            what=f"the source failing over to {other} ({client})",
        )
        source.stop()
        report = dep.wait_drained(source)
        after = counts(metrics)[other]
        print(
            f"seed {seed}: killed {victim} after it applied {before[victim]} entries; "
            f"{other} went from {before[other]} to {after}: {report.counts()}"
        )
        report.assert_clean()
        assert report.applied > 0 and not source.errors, source.errors[:5]
        # Both members really received batches: the victim before, the other after.
        assert before[victim][client] > 0 and after[client] > before[other][client]
    except BaseException:
        print("\n".join(dep.events))
        print(dep.logs())
        raise
    finally:
        source.close()
        dep.close()
