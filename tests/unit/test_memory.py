"""The server's allocator setting (the resident-size effect is in test_memory_bound)."""

from __future__ import annotations

import platform

from lr_server.ops.memory import LARGE_BLOCK, map_large_blocks
from tests.kit.guards import need


def test_large_blocks_are_mapped_on_their_own_under_glibc() -> None:
    need(platform.libc_ver()[0] == "glibc", "the allocator setting is glibc's")
    assert map_large_blocks(LARGE_BLOCK) is True
    # Idempotent: the server may be started more than once in a process.
    assert map_large_blocks(LARGE_BLOCK) is True
