"""``lr parked`` against real databases (SQLite and PostgreSQL): list, show, retry, discard."""

from __future__ import annotations

from pathlib import Path

from lr_client import RoutingQueueSubscriber
from lr_client.failure_policy import FailurePolicy
from lr_client.store import SQLAlchemyQueueStore
from tests.integration.test_cli import as_json, lr, ok, site
from tests.integration.test_parking import CLIENT, Base, Poisoned, entries

__all__ = ["site"]  # the fixture


def test_parked_list_show_retry_discard(site: Path, store: SQLAlchemyQueueStore) -> None:
    Base.metadata.create_all(store.engine)
    store.recv.apply_log_batch("site-x", CLIENT, entries(1, 4, lambda p: b"k" if p >= 2 else None))
    listener = Poisoned({2, 4})
    policy = FailurePolicy("park", max_attempts=1)
    with RoutingQueueSubscriber(store, CLIENT, listener, failure_policy=policy) as sub:
        assert sub.poll_once() == 4
    rows = as_json("parked", "list", "--config", site, "--client", CLIENT)
    assert [(r["source_position"], r["state"], r["key"]) for r in rows] == [
        (2, "parked", "k"),
        (3, "held", "k"),
        (4, "held", "k"),
    ]
    assert "cannot apply [2]" in rows[0]["error"]
    assert as_json("parked", "list", "--config", site, "--source", "other") == []
    table = ok("parked", "list", "--config", site).stdout
    assert "parked entries" in table and "held" in table
    head = rows[0]["parked_id"]
    shown = as_json("parked", "show", "--config", site, str(head))
    assert shown["payload"] == "v2"
    assert ok("parked", "show", "--config", site, str(head)).stdout.count("payload: v2") == 1
    refused = lr("parked", "retry", "--config", site, str(rows[1]["parked_id"]))
    assert refused.exit_code == 1 and "held, not parked" in refused.stderr
    assert lr("parked", "show", "--config", site, "999").exit_code == 1
    out = ok("parked", "discard", "--config", site, str(head), "--by", "ops-anna").stdout
    assert "1 entries discarded by ops-anna" in out
    gone = as_json("parked", "list", "--config", site, "--state", "discarded")
    assert [(r["parked_id"], r["discarded_by"]) for r in gone] == [(head, "ops-anna")]
    assert gone[0]["discarded_at"] is not None
    # The held entries of the key now flow: 3 is applied, 4 fails alone and is parked.
    with RoutingQueueSubscriber(store, CLIENT, listener, failure_policy=policy) as sub:
        sub.poll_once()
    left = as_json("parked", "list", "--config", site)
    assert [(r["source_position"], r["state"]) for r in left] == [(4, "parked")]
    listener.poison.clear()
    assert (
        "1 entries to retry"
        in ok("parked", "retry", "--config", site, str(left[0]["parked_id"])).stdout
    )
    with RoutingQueueSubscriber(store, CLIENT, listener, failure_policy=policy) as sub:
        sub.poll_once()
    assert as_json("parked", "list", "--config", site) == []
    done = as_json("parked", "list", "--config", site, "--state", "retried")
    assert [r["source_position"] for r in done] == [3, 4]


def test_status_shows_blocked_queues_and_parked_counts(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    Base.metadata.create_all(store.engine)
    store.recv.apply_log_batch("site-x", CLIENT, entries(1, 3))
    store.recv.apply_log_batch("site-y", CLIENT, entries(11, 2))
    park = FailurePolicy("park", max_attempts=1)
    with RoutingQueueSubscriber(store, CLIENT, Poisoned({2}), failure_policy=park) as sub:
        sub.poll_once()
    report = as_json("status", "--config", site)
    assert report["parked_entries"] == [{"client": CLIENT, "source": "site-x", "entries": 1}]
    assert report["blocked_queues"] == []
    store.recv.apply_log_batch("site-x", CLIENT, entries(4, 1))
    block = FailurePolicy("block", max_attempts=1)
    with RoutingQueueSubscriber(store, CLIENT, Poisoned({4}), failure_policy=block) as sub:
        sub.poll_once()
    (blocked,) = as_json("status", "--config", site)["blocked_queues"]
    assert (blocked["source"], blocked["partition"], blocked["attempts"]) == ("site-x", None, 1)
    assert "cannot apply [4]" in blocked["error"]
    shown = ok("status", "--config", site).stdout
    assert "blocked queues" in shown and "parked entries" in shown
