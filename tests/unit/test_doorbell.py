"""Doorbell: a wait ends at a ring after its turn, however the ring and the wait interleave."""

from __future__ import annotations

import threading

from lr_client.doorbell import Doorbell
from tests.kit.wait import join


def test_a_ring_before_the_wait_but_after_the_turn_ends_it_at_once() -> None:
    bell = Doorbell()
    turn = bell.turn()
    bell.ring()
    assert bell.wait(turn, 3600.0) is True
    assert bell.wait(bell.turn(), 0.0) is False  # nothing rang since


def test_a_ring_during_the_wait_wakes_every_waiter() -> None:
    bell = Doorbell()
    turn = bell.turn()
    woken: list[bool] = []
    waiters = [
        threading.Thread(target=lambda: woken.append(bell.wait(turn, 3600.0))) for _ in range(3)
    ]
    for w in waiters:
        w.start()
    bell.ring()
    for w in waiters:
        join(w, 30)
    assert woken == [True, True, True]


def test_a_wait_without_a_ring_times_out() -> None:
    bell = Doorbell()
    assert bell.wait(bell.turn(), 0.01) is False
