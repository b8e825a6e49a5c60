"""Keep the process's resident size close to what it holds (invariant I9).

glibc serves a freed large block's size from its heaps afterwards (its mmap
threshold grows with every such free, up to 32 MiB on 64-bit), so a process
that copies multi-megabyte payloads between threads keeps the freed copies
resident in one heap per thread: the resident size grows well past the data
held at any moment. A fixed threshold makes every block of at least
``LARGE_BLOCK`` bytes its own mapping, returned to the system when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("lr.memory")

#: Blocks of this size and larger are mapped on their own and unmapped when freed.
LARGE_BLOCK = 1024 * 1024

_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h


def map_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; whether it took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc: its allocator is left as it is
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("could not set the allocator's mmap threshold")
    return ok


__all__ = ["LARGE_BLOCK", "map_large_blocks"]
