"""The OpenTelemetry side of :mod:`lr_client.tracing`: imported only when tracing is on.

Spans come from the process's global tracer provider
(``opentelemetry.trace.get_tracer_provider()``): whatever the application or
the operator configured, exporters included. Without one, OpenTelemetry's
default no-op provider makes spans that record nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from lr_client.headers import TRACEPARENT, TRACESTATE, decode_headers

_W3C = TraceContextTextMapPropagator()
_SCOPE = "lr_client"

Stamp = Callable[[dict[str, str] | None], dict[str, str] | None]


def _tracer() -> trace.Tracer:
    return trace.get_tracer(_SCOPE)


def transmit_stamp(source: str, client: str) -> Stamp:
    attributes = {"lr.source": source, "lr.client": client}
    span = _tracer().start_span("lr.transmit", kind=trace.SpanKind.PRODUCER, attributes=attributes)
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    span.end()
    parent, state = carrier.get("traceparent"), carrier.get("tracestate")

    def stamp(headers: dict[str, str] | None) -> dict[str, str] | None:
        if not parent:  # a provider that records nothing, and no caller's context
            return headers
        out = dict(headers or {})
        out[TRACEPARENT] = parent
        if state:
            out[TRACESTATE] = state
        return out

    return stamp


def _context(headers: Any) -> trace.SpanContext | None:
    """The valid span context an entry's headers (a mapping or their stored form) carry."""
    found = headers if isinstance(headers, Mapping) else decode_headers(headers)
    if TRACEPARENT not in found:
        return None
    carrier = {"traceparent": found[TRACEPARENT], "tracestate": found.get(TRACESTATE, "")}
    ctx = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
    return ctx if ctx.is_valid else None


@contextmanager
def batch_span(
    name: str,
    source: str,
    client: str,
    contexts: Iterable[tuple[int, Any]],
    attributes: dict[str, Any],
) -> Iterator[None]:
    links: list[trace.Link] = []
    first: trace.SpanContext | None = None
    positions = []
    for position, headers in contexts:
        positions.append(position)
        ctx = None if headers is None else _context(headers)
        if ctx is None:
            continue
        first = first or ctx
        entry: dict[str, str | int] = {
            "lr.source": source,
            "lr.client": client,
            "lr.position": position,
        }
        links.append(trace.Link(ctx, entry))
    attrs = {"lr.source": source, "lr.client": client, **attributes}
    if positions:
        attrs.update({"lr.first_position": positions[0], "lr.last_position": positions[-1]})
    if first is None:  # no traced entry: no span
        yield
        return
    parent = trace.set_span_in_context(trace.NonRecordingSpan(first))
    with _tracer().start_as_current_span(name, context=parent, links=links, attributes=attrs):
        yield


__all__ = ["Stamp", "batch_span", "transmit_stamp"]
