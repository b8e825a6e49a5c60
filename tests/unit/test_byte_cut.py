"""The byte-cut rule: :func:`within` (running totals) takes what :class:`ByteCut` takes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lr_client.store.byte_bounds import ENTRY_OVERHEAD, ByteCut, bytes_prefix, within


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), max_size=60),
    max_bytes=st.one_of(st.none(), st.integers(min_value=0, max_value=40000)),
)
def test_within_takes_the_prefix_of_the_byte_cut_rule(
    sizes: list[int], max_bytes: int | None
) -> None:
    rows = [(i, size, None) for i, size in enumerate(sizes)]  # (key, size, inline)
    taken = within(rows, max_bytes)
    assert taken == rows[: bytes_prefix(sizes, max_bytes)]


def test_the_first_entry_is_taken_even_beyond_the_limit() -> None:
    rows = [(1, 10_000, None), (2, 1, None)]
    assert within(rows, 100) == rows[:1]
    assert within([], 100) == []
    exact = [(1, 100 - ENTRY_OVERHEAD, None), (2, 0, None)]
    assert within(exact, 100) == exact[:1]


def test_the_byte_cut_counts_each_entrys_overhead_and_takes_an_exact_fit() -> None:
    fill = 2 * (10 + ENTRY_OVERHEAD)  # two payloads of 10 bytes, overhead included
    assert bytes_prefix([10, 10, 0], fill) == 2  # the second fills the limit exactly
    assert bytes_prefix([10, 10], fill - 1) == 1  # one byte short: the overhead counts
    assert bytes_prefix([10, 10], None) == 2
    cut = ByteCut(fill)
    assert cut.take(10) and cut.take(10) and not cut.take(0)
    assert (cut.count, cut.total) == (2, fill)
