from __future__ import annotations

import lr_client
from lr_client import errors


def test_tree_splits_transient_from_permanent() -> None:
    classes = [getattr(errors, n) for n in errors.__all__]
    for cls in classes:
        assert issubclass(cls, errors.LRError)
        assert cls.__doc__, cls
        assert str(cls()) == cls.__doc__.strip().splitlines()[0]
    assert not set(errors.TransientError.__subclasses__()) & set(
        errors.PermanentError.__subclasses__()
    )
    assert issubclass(errors.InvalidInputError, ValueError)
    assert all(getattr(lr_client, n) is getattr(errors, n) for n in errors.__all__)
