"""What a server does with its database before it serves: the schema, the registered
destinations and the configured cascades, retried while the database cannot be reached
(not up yet, or a connection cut at the wrong moment)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
)

from lr_client.errors import TransientError
from lr_client.store import QueueStore
from lr_server.config import SiteConfig

log = logging.getLogger("lr.server")

T = TypeVar("T")

#: How long a server's start retries a database it cannot reach before it gives up.
START_RETRY_S = 60.0


def until_reachable(
    step: Callable[[], T], what: str, stop: threading.Event, within: float = START_RETRY_S
) -> T:
    """``step()``, retried on a transient store error at growing intervals (0.1 s up to
    5 s) for up to ``within`` seconds or until ``stop`` is set, then that error; any
    other error at once."""

    def warn(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning("%s failed (%s): retrying", what, error)

    retrying: Retrying = Retrying(
        retry=retry_if_exception_type(TransientError),
        stop=stop_after_delay(within) | stop_when_event_set(stop),
        wait=wait_exponential(multiplier=0.1, max=5.0),
        sleep=stop.wait,  # type: ignore[arg-type]  # returns early on stop
        before_sleep=warn,
        reraise=True,
    )
    return retrying(step)


def prepare_database(store: QueueStore, config: SiteConfig) -> None:
    """Create or check the schema, register the destinations, record the cascades (each
    step idempotent: a retry after a cut connection does it again)."""
    store.create_schema()
    store.check_schema()
    store.sites.register_sites([d.id for d in config.destinations])
    apply_cascades(store, config)


def apply_cascades(store: QueueStore, config: SiteConfig) -> None:
    """Write each ``[cascade.<client>]`` table into ``lrq_cascade`` (see
    :meth:`~lr_client.store.contract.Cascading.apply_cascade_config`)."""
    for c in config.cascades:
        node = store.cascade.apply_cascade_config(
            c.client,
            c.root,
            c.role_of(config.id).value,
            c.provider_of(config.id),
            c.children_of(config.id),
            sorted(c.nodes),
        )
        log.info(
            "cascade %s: %s, provider %s (epoch %d)",
            c.client,
            node.role,
            node.provider_id or "-",
            node.epoch,
        )


__all__ = ["START_RETRY_S", "apply_cascades", "prepare_database", "until_reachable"]
