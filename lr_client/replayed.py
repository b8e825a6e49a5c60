"""How a receive queue marks the entries it holds again on an operator's request.

A replayed log entry (``lr replay`` at the source, ``lr rewind`` at the sink)
is stored with :data:`REPLAYED_MARK` as its ``snapshot_id``, which a log entry
otherwise leaves empty; a real snapshot id is alphanumeric, so the mark is
never one. Delivery gives the listener ``message.replayed`` True and an empty
``snapshot_id`` for it.
"""

from __future__ import annotations

#: The ``snapshot_id`` of a replayed log entry in a receive queue.
REPLAYED_MARK = "~replayed"

__all__ = ["REPLAYED_MARK"]
