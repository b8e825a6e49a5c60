"""``lr`` under an OpenTelemetry SDK tracer provider that writes each finished span as
a JSON line to a file, as an operator's own wrapper would install an exporter:

    python -m tests.kit.traced_server SPANS_FILE server --config site.toml

Each line: the span's name, trace and span ids (hex), its parent's span id (or
null), its attributes, and its links (trace id, span id, attributes).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain data (what the tests compare)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
    }


class FileExporter(SpanExporter):
    """Appends each span as a JSON line to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        with self.lock, self.path.open("a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(Path(sys.argv[1]))))
    trace.set_tracer_provider(provider)
    from lr_server.cli import main as lr

    lr(sys.argv[2:])


if __name__ == "__main__":
    main()
