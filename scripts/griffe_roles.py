"""Griffe extension for the API reference: reST roles in docstrings become code spans.

Docstrings name objects the reST way (``:class:`RoutingQueueClient```,
``:meth:`~lr_client.store.QueueStore.trim```); Markdown would show the role
verbatim. Each becomes a code span of the name (its last part after ``~``).
mkdocs.yml loads this file through mkdocstrings' ``extensions`` option.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def to_code(match: re.Match[str]) -> str:
    """``:role:`a.b.C``` -> ```a.b.C```; ``:role:`~a.b.C``` -> ```C```."""
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class SphinxRolesAsCode(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(to_code, obj.docstring.value)
