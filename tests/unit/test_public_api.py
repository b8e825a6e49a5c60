"""The public API: what ``__all__`` lists is exported, documented, and listed in docs/api.md."""

from __future__ import annotations

import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

import lr_client
import lr_client.aio
import lr_server
import lr_server.admin

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"
PACKAGES = [lr_client, lr_client.aio, lr_server, lr_server.admin]


def public(package: types.ModuleType) -> list[tuple[str, object]]:
    return [(name, getattr(package, name)) for name in package.__all__]


def own_doc(obj: object) -> str:
    """The object's own docstring (a class's, not one inherited from a base)."""
    if inspect.isclass(obj):
        return str(obj.__dict__.get("__doc__") or "")
    return str(getattr(obj, "__doc__", "") or "")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_listed_name_is_importable_from_the_package(package: types.ModuleType) -> None:
    assert len(set(package.__all__)) == len(package.__all__)
    fresh = importlib.import_module(package.__name__)
    for name in package.__all__:
        namespace: dict[str, object] = {}
        exec(f"from {package.__name__} import {name}", namespace)
        assert namespace[name] is getattr(fresh, name)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_class_and_function_has_its_own_docstring(package: types.ModuleType) -> None:
    missing = [
        name
        for name, obj in public(package)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and len(own_doc(obj).strip()) < 10
    ]
    assert missing == []
    values = [name for name, obj in public(package) if not callable(obj)]
    assert set(values) <= {"DEFAULT_MAX_PAYLOAD_BYTES", "__version__"}  # documented below
    assert own_doc(package).strip()


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_what_the_package_exports(package: types.ModuleType) -> None:
    """Every public name of the package's namespace is in ``__all__`` (modules aside)."""
    exported = {
        name
        for name, obj in vars(package).items()
        if not name.startswith("_")
        and not isinstance(obj, types.ModuleType)
        and name != "annotations"  # from __future__
    }
    assert exported == set(package.__all__) - {"__version__"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_method_of_an_exported_class_has_a_docstring(
    package: types.ModuleType,
) -> None:
    missing = []
    for name, obj in public(package):
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not (
                inspect.isfunction(member) or isinstance(member, property)
            ):
                continue
            if not own_doc(member).strip():
                missing.append(f"{name}.{attr}")
    assert missing == []


def test_docs_api_names_every_public_name() -> None:
    text = API_DOC.read_text()
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text))
    for package in PACKAGES:
        absent = sorted(set(package.__all__) - named)
        assert absent == [], f"docs/api.md does not name {package.__name__}.{absent}"
