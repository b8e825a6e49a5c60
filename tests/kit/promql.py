"""The metric names a PromQL expression reads, and the sample names a registry exports.

:func:`metric_names` finds the series names of an expression without a full
parser: string literals, label matchers, ranges, grouping label lists and
keywords are removed first; of the identifiers left, those followed by ``(``
are functions or aggregations, the others metric names. A name given as
``{__name__="..."}`` counts too. Grafana's ``$variables`` are ignored.

:func:`exported_samples` lists what a ``prometheus_client`` registry puts on
``/metrics``: each family's samples, and for families without any yet (a
labelled metric before its first ``labels()``) the names its type exports.
"""

from __future__ import annotations

import re

from prometheus_client.registry import CollectorRegistry

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_EQUALS = re.compile(r'__name__\s*=\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_NAME_OTHER = re.compile(r"__name__\s*(?:!=|=~|!~)")
_COMMENT = re.compile(r"#[^\n]*")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
# Not preceded by a word character (the unit of a duration, the exponent of a
# number), a dot or a ``$`` (a Grafana variable).
_IDENTIFIER = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")
_RATED = re.compile(r"\b(?:rate|irate|increase)\s*\(\s*([A-Za-z_:][\w:]*)")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan"}
)

#: The sample names each metric type exports, as suffixes of the family's name.
SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}


def _bare(expr: str) -> str:
    """``expr`` without strings, comments, label matchers, ranges and grouping lists."""
    text = _STRING.sub('""', expr)
    text = _COMMENT.sub("", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    return _GROUPING.sub(" ", text)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects series of."""
    if _NAME_OTHER.search(expr):
        raise ValueError(f"a __name__ matcher other than '=' is not supported: {expr!r}")
    names = {m.group(1)[1:-1] for m in _NAME_EQUALS.finditer(expr)}
    text = _bare(expr)
    for m in _IDENTIFIER.finditer(text):
        word = m.group(0)
        if text[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def rated_names(expr: str) -> set[str]:
    """The metric names ``expr`` passes to ``rate``, ``irate`` or ``increase``."""
    text = _STRING.sub('""', _COMMENT.sub("", expr))
    return {m.group(1) for m in _RATED.finditer(text)}


def exported_samples(registry: CollectorRegistry) -> dict[str, str]:
    """{sample name: type of its family} of everything ``registry`` exports."""
    out: dict[str, str] = {}
    for family in registry.collect():
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = family.type
        for sample in family.samples:
            out[sample.name] = family.type
    return out


__all__ = ["SUFFIXES", "exported_samples", "metric_names", "rated_names"]
