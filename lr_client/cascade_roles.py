"""A node's role in a cascaded client's set (docs/cascading.md): the one definition.

The configuration derives it (``lr_server.config.CascadeConfig.role_of``), the
store records it in ``lrq_cascade.role`` (its values are the column's), and
the sender, the server and the control plane act on it.
"""

from __future__ import annotations

import enum


class CascadeRole(enum.StrEnum):
    """A node's place in a cascaded client's set (docs/cascading.md)."""

    ROOT = "root"  # originates the client: its application transmits
    BRANCH = "branch"  # applies the client and forwards it to the nodes below
    LEAF = "leaf"  # applies only


__all__ = ["CascadeRole"]
