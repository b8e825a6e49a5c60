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
    recv_tag,
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


def test_errors_name_what_is_wrong() -> None:
    """The message names the kind of name and the value, so an operator can fix it."""
    pattern = "expected [a-z0-9][a-z0-9-]{0,62}"
    cases = [
        (lambda: validate_name("A"), f"invalid name 'A': {pattern}"),
        (lambda: validate_name("A", "site id"), f"invalid site id 'A': {pattern}"),
        (lambda: logentry_tag("B"), "invalid site id 'B'"),
        (lambda: snapsync_tag("B"), "invalid site id 'B'"),
        (lambda: recv_tag("C"), "invalid client name 'C'"),
        (lambda: recv_queue_name("C", "site-a"), "invalid client name 'C'"),
        (lambda: recv_queue_name("policy", "S"), "invalid site id 'S'"),
        (lambda: parse_recv_queue_name("x"), "not a receive queue name: 'x'"),
        (lambda: parse_recv_queue_name("LRQ_Recv_p"), "not a receive queue name: 'LRQ_Recv_p'"),
        (lambda: parse_recv_queue_name("LRQ_Recv_C__a"), "invalid client name 'C'"),
        # the first separator splits: what follows it is the source, and is invalid here
        (lambda: parse_recv_queue_name("LRQ_Recv_a__b__c"), "invalid site id 'b__c'"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidNameError) as caught:
            call()
        assert str(caught.value).startswith(message), (message, str(caught.value))


def test_recv_tag() -> None:
    assert recv_tag("policy") == "lrq_recv_policy"
