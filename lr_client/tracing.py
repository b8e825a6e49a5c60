"""Trace context through replication: transmit -> ship -> receive -> apply.

A tiny interface over OpenTelemetry that costs nothing without it. Tracing is
on in a process that imported ``opentelemetry.trace`` (an application that
configures a tracer provider does), or that called :func:`enable` (``lr
server`` with ``[tracing] enabled = true``); otherwise every call here is a
check of ``sys.modules`` and no OpenTelemetry module is imported. When on,
:mod:`lr_client.otel_spans` does the work with the process's global tracer
provider:

- a transmit makes a ``lr.transmit`` span (a child of the caller's current
  span) and records its W3C trace context in the entry's headers, under the
  library's names :data:`TRACEPARENT` and :data:`TRACESTATE`;
- each stage that handles a batch (``lr.ship`` in the sending ``lr server``,
  ``lr.receive`` in the receiving one, ``lr.apply`` around the listener) makes
  one span per batch: a child of the first traced entry's context, linked to
  every traced entry's context, each link with the entry's source, client and
  position (``lr.source``, ``lr.client``, ``lr.position``).

So one trace holds a traced entry's transmit and the ship, receive and apply
of the batch it led; the other entries of that batch reach theirs by link.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from lr_client.errors import ConfigError
from lr_client.headers import TRACEPARENT, TRACESTATE

#: True: on; False: off; None: on once ``opentelemetry.trace`` is imported.
_switch: bool | None = None
_OFF: AbstractContextManager[None] = nullcontext()

#: Adds the trace context to an entry's headers (checked, None: none); returns them.
Stamp = Callable[[dict[str, str] | None], dict[str, str] | None]
#: (source position, headers: a mapping or their stored form) of each entry of a batch.
Contexts = Iterable[tuple[int, Any]]


def enable(on: bool | None = True) -> None:
    """Turn tracing on in this process (``[tracing] enabled``; needs the ``otel`` extra),
    off (``False``), or back to its default (``None``: on once an application imported
    ``opentelemetry.trace``)."""
    global _switch
    if on:
        try:
            from lr_client import otel_spans  # noqa: F401
        except ImportError:
            raise ConfigError(
                "tracing.enabled: needs OpenTelemetry (pip install 'lr-routing-queue[otel]')"
            ) from None
    _switch = on


def active() -> bool:
    """Whether tracing is on (see the module's docstring and :func:`enable`)."""
    if _switch is None:
        return "opentelemetry.trace" in sys.modules
    return _switch


def _unchanged(headers: dict[str, str] | None) -> dict[str, str] | None:
    return headers


#: The stamp of a transmit while tracing is off: the headers as given.
UNCHANGED: Stamp = _unchanged


def transmit_stamp(source: str, client: str) -> Stamp:
    """Make the ``lr.transmit`` span of one transmit call (a child of the caller's
    current span, ended at once: it marks the moment) and return what adds its
    context to each of the call's entries' headers."""
    if not active():
        return _unchanged
    from lr_client import otel_spans

    return otel_spans.transmit_stamp(source, client)


def batch_span(
    name: str, source: str, client: str, contexts: Contexts, **attributes: Any
) -> AbstractContextManager[None]:
    """One stage's span over a batch (``name``: ``lr.ship``, ``lr.receive``,
    ``lr.apply``), linked to its traced entries; ``contexts`` is read only when on."""
    if not active():
        return _OFF
    from lr_client import otel_spans

    return otel_spans.batch_span(name, source, client, contexts, attributes)


__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "UNCHANGED",
    "Contexts",
    "Stamp",
    "active",
    "batch_span",
    "enable",
    "transmit_stamp",
]
