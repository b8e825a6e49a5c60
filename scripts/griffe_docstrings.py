"""Griffe extension for the API reference: the project's docstring conventions in Markdown.

* reST roles (``:class:`RoutingQueueClient```, ``:meth:`~a.b.C.m```) would be
  shown verbatim: each becomes a code span of the name (its last part after
  ``~``).
* A module or class attribute is documented by the ``#:`` comment lines just
  above it (as Sphinx reads them): they become its docstring when it has none.

mkdocs.yml loads this file through mkdocstrings' ``extensions`` option.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def to_code(match: re.Match[str]) -> str:
    """``:role:`a.b.C``` -> ```a.b.C```; ``:role:`~a.b.C``` -> ```C```."""
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


def doc_comment(attr: griffe.Attribute) -> str | None:
    """The ``#:`` lines just above ``attr``'s assignment, without the marker."""
    if attr.lineno is None or not isinstance(attr.filepath, Path):
        return None
    try:
        lines = attr.lines_collection[attr.filepath]
    except KeyError:
        return None
    found: list[str] = []
    index = attr.lineno - 2  # the line above the assignment (lineno is 1-based)
    while 0 <= index < len(lines) and lines[index].lstrip().startswith("#:"):
        found.insert(0, lines[index].lstrip()[2:].strip())
        index -= 1
    return "\n".join(found) or None


class DocstringConventions(griffe.Extension):
    """Applies both conventions to every object griffe loads."""

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.docstring is None and (comment := doc_comment(attr)) is not None:
            text = ROLE.sub(to_code, comment)
            attr.docstring = griffe.Docstring(text, lineno=attr.lineno, parent=attr)

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(to_code, obj.docstring.value)
