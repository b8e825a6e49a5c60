"""``lr browse``'s preview of a payload of which only the head was read."""

from __future__ import annotations

from lr_client.store.ops.inspection import BROWSE_HEAD_BYTES
from lr_server.ops.browse import PREVIEW_CHARS, preview


def test_a_head_shorter_than_the_payload_is_marked_cut() -> None:
    assert preview(b"abc") == "abc"
    assert preview(b"abc", size=3) == "abc"
    assert preview(b"abc", size=1000) == "abc…"
    assert preview(b"\x00\x01", size=2) == "0x0001"
    assert preview(b"\x00\x01", size=3) == "0x0001…"


def test_a_character_cut_at_the_end_of_the_head_is_still_text() -> None:
    whole = "é".encode() * 100  # 200 bytes
    head = whole[: BROWSE_HEAD_BYTES - 1]  # ends inside a character
    assert preview(head, size=len(whole)) == "é" * PREVIEW_CHARS + "…"
    assert preview(head).startswith("0x")  # without the size, a cut character is binary


def test_the_head_read_is_enough_for_a_preview() -> None:
    assert BROWSE_HEAD_BYTES >= PREVIEW_CHARS * 4  # the longest UTF-8 characters
