"""Where relay reads of a relayed receive queue may start (see :mod:`.cascade`).

A relayed queue keeps every entry a node below has not acknowledged, and a
read after position ``p`` must not pass them all again each time. Past the
last full sync's end, a queue's log entries are stored in origin order (one
writer appends to a queue at a time, in order), so a *mark* ``(queue, p) ->
seq`` says: every log entry of the queue with a position above ``p`` has a
``seq`` above ``seq``. A mark at ``q <= p`` is a valid start for a read after
``p`` too, only a longer one.

Marks are recorded where a read ended (its last entry), and where a read found
nothing past ``p`` (the queue's highest ``seq``, read before it): a branch that
forwards batches before storing them (``lr_server.sending.relay_inbox``) reads after
positions no read ended at, and these reads find nothing.
"""

from __future__ import annotations

import threading

#: Marks kept at most (one per child that reads at its own pace is enough).
MAX_MARKS = 256


class RelayMarks:
    """The marks of one store's relayed queues; thread-safe (a session per child)."""

    def __init__(self, limit: int = MAX_MARKS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._marks: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def start(self, queue_id: int, after: int) -> tuple[int, bool]:
        """(seq, exact): where a read of ``queue_id`` after ``after`` may start (0: the
        relay's start), and whether a mark at ``after`` itself says so."""
        with self._lock:
            seq = self._marks.get((queue_id, after))
            if seq is not None:
                return seq, True
            below = [(p, s) for (q, p), s in self._marks.items() if q == queue_id and p < after]
        return (max(below)[1] if below else 0), False

    def note(self, queue_id: int, position: int, seq: int) -> None:
        """Every log entry of the queue past ``position`` has a ``seq`` above ``seq``."""
        with self._lock:
            key = (queue_id, position)
            if key not in self._marks and len(self._marks) >= self.limit:
                self._marks.pop(next(iter(self._marks)))
            self._marks[key] = max(seq, self._marks.get(key, 0))


__all__ = ["MAX_MARKS", "RelayMarks"]
