from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lr_client.errors import InvalidNameError
from lr_client.names import (
    NAME_RE,
    logentry_tag,
    parse_recv_queue_name,
    recv_queue_name,
    snapsync_tag,
    validate_name,
)

valid_names = st.from_regex(NAME_RE, fullmatch=True)


@pytest.mark.parametrize("bad", ["", "A", "-a", "a_b", "a b", "a;drop", "é", "a" * 64, None, 3])
def test_invalid_names_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidNameError):
        validate_name(bad)


def test_tags_and_queue_names() -> None:
    assert logentry_tag("site-b") == "lrq_logentry_site-b"
    assert snapsync_tag("site-b") == "lrq_snapsync_site-b"
    assert recv_queue_name("policy", "site-a") == "LRQ_Recv_policy__site-a"


@given(valid_names, valid_names, valid_names, valid_names)
def test_queue_names_never_collide(c1: str, s1: str, c2: str, s2: str) -> None:
    same = recv_queue_name(c1, s1) == recv_queue_name(c2, s2)
    assert same == ((c1, s1) == (c2, s2))
    assert parse_recv_queue_name(recv_queue_name(c1, s1)) == (c1, s1)


@pytest.mark.parametrize("bad", ["LRQ_Recv_policy", "LRQ_Send_x__y", "LRQ_Recv_a_b__c"])
def test_parse_rejects_foreign_names(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        parse_recv_queue_name(bad)
