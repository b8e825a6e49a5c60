"""The headers' one encoding: compact, stable, read back read-only; a peer's checked."""

from __future__ import annotations

import pytest

from lr_client.errors import ProtocolError
from lr_client.headers import EMPTY, decode_headers, encode_headers, received_headers


def test_the_stored_form_is_compact_sorted_json_and_reads_back() -> None:
    blob = encode_headers({"schema": "v2", "content-type": "é"})
    assert blob == '{"content-type":"é","schema":"v2"}'.encode()
    assert dict(decode_headers(blob)) == {"content-type": "é", "schema": "v2"}
    assert dict(decode_headers(memoryview(blob))) == {"content-type": "é", "schema": "v2"}
    assert encode_headers({}) is None and encode_headers(None) is None
    assert decode_headers(None) is EMPTY and decode_headers(b"") is EMPTY


def test_a_peers_headers_are_checked_and_may_hold_the_librarys_names() -> None:
    assert received_headers({"lr-traceparent": "00-a"}) == b'{"lr-traceparent":"00-a"}'
    assert received_headers({}) is None
    with pytest.raises(ProtocolError, match="malformed entry headers"):
        received_headers({"Bad Name": "x"})
