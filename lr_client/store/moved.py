"""The store's methods from before it had roles, forwarded for one release.

``store.request_snapshot(...)`` is ``store.snapshots.request_snapshot(...)`` now;
the old spelling still works, with a :class:`DeprecationWarning` naming the new
one (docs/upgrading.md). Only attribute lookups that find nothing come here.
"""

from __future__ import annotations

import inspect
import warnings
from functools import cache
from typing import Any

from lr_client.store import contract


@cache
def role_of() -> dict[str, str]:
    """{method name: the store attribute of the role that has it now}."""
    out: dict[str, str] = {}
    for attr, role in inspect.get_annotations(contract.QueueStore, eval_str=True).items():
        for name, value in vars(role).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                out.setdefault(name, attr)
    return out


def forward(store: object, name: str) -> Any:
    """The role's method for ``store.<name>``, with a warning; AttributeError if no role
    has such a method."""
    role = role_of().get(name)
    if role is None:
        raise AttributeError(f"{type(store).__name__!r} object has no attribute {name!r}")
    warnings.warn(
        f"store.{name}() is store.{role}.{name}() now; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(getattr(store, role), name)


__all__ = ["forward", "role_of"]
