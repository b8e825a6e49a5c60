"""A sink's side of end-to-end encryption: the listener's messages, decrypted.

:func:`open_messages` is called by the subscribers' call planner
(:class:`~lr_client.listener_calls.CallPlanner`) in the delivery transaction,
before the listener: an entry that does not open raises
:class:`~lr_client.errors.KeyUnavailableError` or
:class:`~lr_client.errors.DecryptionError`, the transaction rolls back, the
queue stays where it is (nothing applied, nothing skipped) and is retried
with the subscriber's backoff: it resumes once the keyring holds the key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from lr_client.encryption import is_sealed, open_sealed
from lr_client.errors import DecryptionError, EncryptionError
from lr_client.keys import Keyring
from lr_client.listener import RoutingQueueMessage
from lr_client.records import QueueInfo, ReplicationType
from lr_client.sealed_headers import SEALED, open_headers

log = logging.getLogger("lr_client.encryption")


def open_messages(
    keyring: Keyring, queue: QueueInfo, messages: Sequence[RoutingQueueMessage]
) -> list[RoutingQueueMessage]:
    """``messages`` with their payloads decrypted. A log entry must be sealed; a
    snapshot entry is opened if it is (a provider's entries are written as it gives
    them). The first entry that does not open raises, naming the queue and position."""
    out = []
    for m in messages:
        try:
            if is_sealed(m.payload):
                m = replace(m, payload=open_sealed(keyring, m.payload, m.source_id, m.client_name))
            elif m.type is ReplicationType.LOG_ENTRY_SYNC:
                raise DecryptionError("the entry is not encrypted, and this subscriber requires it")
            if SEALED in m.headers:
                m = replace(m, headers=open_headers(keyring, m.headers, m.source_id, m.client_name))
        except EncryptionError as exc:
            error = type(exc)(
                f"{queue.queue_name}: delivery blocked at source position "
                f"{m.source_position}: {exc}"
            )
            log.error("%s", error)
            raise error from None
        out.append(m)
    return out


__all__ = ["open_messages"]
