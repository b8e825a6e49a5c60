"""The admin API's errors: one root, under :class:`~lr_client.errors.LRError`.

* :class:`AdminError` (an :class:`~lr_client.errors.LRError`)

  * :class:`AdminInputError` (also an :class:`~lr_client.errors.InvalidInputError`):
    the arguments do not fit the site's config; nothing was changed. ``option``
    names the argument at fault (``destination``, ``client``, ``to``, ``source``)
    or is None when the config itself forbids the action.
  * :class:`NotFoundError`: no such member, snapshot or cascaded node.
  * :class:`StateError`: the thing exists but is not in a state the action
    applies to (a snapshot not open, a stream not stopped, a provider already
    in place).

    * :class:`FullSyncNeededError`: what was asked for is no longer held (trimmed):
      only a full sync (``lr snapshot request``) brings the sink back.
"""

from __future__ import annotations

from lr_client.errors import InvalidInputError, LRError


class AdminError(LRError):
    """An operator action failed; nothing was changed."""


class AdminInputError(AdminError, InvalidInputError):
    """The action's arguments do not fit the site's config; nothing was changed."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class NotFoundError(AdminError):
    """No such member, snapshot or cascaded node in the site's database."""


class StateError(AdminError):
    """The action does not apply in the current state (not open, not stopped, ...)."""


class FullSyncNeededError(StateError):
    """The entries asked for were trimmed at the source: a full sync is needed."""


__all__ = ["AdminError", "AdminInputError", "FullSyncNeededError", "NotFoundError", "StateError"]
