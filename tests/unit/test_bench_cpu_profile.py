"""The benchmarks' CPU accounting: a process's CPU seconds, and collapsed py-spy stacks
to top functions."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.cpu_profile import process_cpu, read_collapsed, top_functions


def test_process_cpu_counts_user_and_system_seconds() -> None:
    before = process_cpu(os.getpid())
    assert before is not None
    spin = time.process_time() + 0.2
    while time.process_time() < spin:
        pass
    after = process_cpu(os.getpid())
    assert after is not None and 0.1 <= after - before < 5
    assert process_cpu(2**22 + 12345) is None  # no such process


def test_collapsed_stacks_give_inclusive_and_exclusive_shares(tmp_path: Path) -> None:
    raw = tmp_path / "ship.pyspy"
    raw.write_text(
        "run (lr_server/sending/session.py:10);ship (lr_server/sending/shipping.py:20);"
        "read (a/store.py:5) 6\n"
        "run (lr_server/sending/session.py:10);ship (lr_server/sending/shipping.py:21) 2\n"
        "run (lr_server/sending/session.py:10);wait (threading.py:300) 2\n"
        "run (lr_server/sending/session.py:10);ship (lr_server/sending/shipping.py:20);"
        "read (a/store.py:5) 1\n"
    )
    stacks = read_collapsed(raw)
    assert sum(stacks.values()) == 11
    top = top_functions(stacks, n=3)
    assert top["samples"] == 11
    # The same function at two lines is one function.
    assert top["cumulative"] == [
        ["run (sending/session.py)", 1.0],
        ["ship (sending/shipping.py)", round(9 / 11, 3)],
        ["read (a/store.py)", round(7 / 11, 3)],
    ]
    assert top["self"][0] == ["read (a/store.py)", round(7 / 11, 3)]


def test_a_thread_of_a_process_is_picked_by_a_frame(tmp_path: Path) -> None:
    stacks = {"deliver (lr_client/subscriber.py:1);read (x.py:2)": 3, "spark (py4j/java.py:9)": 5}
    top = top_functions(stacks, within="lr_client/subscriber.py")
    assert top["samples"] == 3
    assert top_functions({}, n=3) == {"samples": 0, "cumulative": [], "self": []}
    assert read_collapsed(Path("/nonexistent/stacks")) == {}
