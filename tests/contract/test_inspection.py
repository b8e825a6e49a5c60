"""Inspection: what running sender sessions say of themselves."""

from __future__ import annotations

from lr_client.store import SQLAlchemyQueueStore
from tests.contract.calls import across_outage, refused_for_no_schema
from tests.contract.outage import Outage


def _summary(store: SQLAlchemyQueueStore) -> list[tuple[object, ...]]:
    return [
        (
            r["destination"],
            r["state"],
            bool(r["connected"]),
            r["inflight_batches"],
            r["inflight_bytes"],
            r["last_error"],
        )
        for r in store.list_session_status()
    ]


def test_session_status_is_one_row_per_destination(store: SQLAlchemyQueueStore) -> None:
    assert store.list_session_status() == []
    store.save_session_status(
        "c", "streaming", connected=True, inflight_batches=2, inflight_bytes=9
    )
    store.save_session_status(
        "b", "backoff", connected=False, inflight_batches=0, inflight_bytes=0, last_error="down"
    )
    assert _summary(store) == [
        ("b", "backoff", False, 0, 0, "down"),
        ("c", "streaming", True, 2, 9, ""),
    ]
    store.save_session_status(
        "b", "streaming", connected=True, inflight_batches=1, inflight_bytes=3
    )
    assert _summary(store) == [
        ("b", "streaming", True, 1, 3, ""),
        ("c", "streaming", True, 2, 9, ""),
    ]
    assert all(r["updated_at"] > 0 for r in store.list_session_status())


def test_a_long_error_is_kept_to_its_start(store: SQLAlchemyQueueStore) -> None:
    error = "".join(chr(ord("a") + i % 26) for i in range(5000))
    store.save_session_status(
        "b", "backoff", connected=False, inflight_batches=0, inflight_bytes=0, last_error=error
    )
    (row,) = store.list_session_status()
    assert row["last_error"] == error[:2000]


def test_an_inspection_method_on_an_empty_database_is_a_schema_error(
    bare_store: SQLAlchemyQueueStore,
) -> None:
    refused_for_no_schema(bare_store, bare_store.list_session_status)


def test_a_lost_connection_is_transient(store: SQLAlchemyQueueStore, outage: Outage) -> None:
    store.save_session_status("b", "idle", connected=True, inflight_batches=0, inflight_bytes=0)
    across_outage(
        outage,
        lambda: store.save_session_status(
            "b", "streaming", connected=True, inflight_batches=1, inflight_bytes=5
        ),
    )
    assert across_outage(outage, lambda: _summary(store)) == [("b", "streaming", True, 1, 5, "")]
