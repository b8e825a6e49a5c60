"""Names of sites, clients, queues and stream tags.

Site ids and client names use ``[a-z0-9][a-z0-9-]{0,62}``: no ``_``, so the
``__`` separator in receive-queue names can never be ambiguous
(``LRQ_Recv_a-b__c`` and ``LRQ_Recv_a__b-c`` are different queues, and no pair
of names can produce the same queue name). Names are always bound as SQL
parameters; they never become SQL text.
"""

from __future__ import annotations

import re

from lr_client.errors import InvalidNameError

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")

SEND_LOG_ENTRIES = "LRQ_Send_LogEntries"
SEND_SNAPSYNC = "LRQ_Send_SnapSync"
RECV_PREFIX = "LRQ_Recv_"
RECV_SEPARATOR = "__"


def validate_name(value: object, what: str = "name") -> str:
    """Return ``value`` if it is a valid site id / client name, else raise."""
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        raise InvalidNameError(f"invalid {what} {value!r}: expected [a-z0-9][a-z0-9-]{{0,62}}")
    return value


#: Tags (the seed's names for the per-destination indexes of the send queues).
LOGENTRY_TAG = "lrq_logentry_"
SNAPSYNC_TAG = "lrq_snapsync_"


def logentry_tag(destination: str) -> str:
    """``lrq_logentry_<site>``: the log entries addressed to a destination."""
    return LOGENTRY_TAG + validate_name(destination, "site id")


def snapsync_tag(destination: str) -> str:
    """``lrq_snapsync_<site>``: the snapshot entries made for a destination."""
    return SNAPSYNC_TAG + validate_name(destination, "site id")


def recv_tag(client_name: str) -> str:
    return f"lrq_recv_{validate_name(client_name, 'client name')}"


def recv_queue_name(client_name: str, source_id: str) -> str:
    """``LRQ_Recv_<client>__<source>``."""
    client = validate_name(client_name, "client name")
    source = validate_name(source_id, "site id")
    return f"{RECV_PREFIX}{client}{RECV_SEPARATOR}{source}"


def parse_recv_queue_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`recv_queue_name`: ``(client_name, source_id)``."""
    if not name.startswith(RECV_PREFIX):
        raise InvalidNameError(f"not a receive queue name: {name!r}")
    client, sep, source = name[len(RECV_PREFIX) :].partition(RECV_SEPARATOR)
    if not sep:
        raise InvalidNameError(f"not a receive queue name: {name!r}")
    return validate_name(client, "client name"), validate_name(source, "site id")
