"""``scripts/mutate`` names functions and tests that exist: a move or rename breaks this test."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lr_mutate_script", ROOT / "scripts/mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _functions(path: Path) -> set[str]:
    """mutmut's names for the functions and methods of one module (without the suffix)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found.add(f"{module}.xǁ{node.name}ǁ{item.name}")
        elif isinstance(node, ast.FunctionDef):
            found.add(f"{module}.x_{node.name}")
    return found


MUTATE = _mutate()


@pytest.mark.parametrize("name", sorted(MUTATE.TARGETS))
def test_every_target_names_code_and_tests_that_exist(name: str) -> None:
    target = MUTATE.TARGETS[name]
    assert all((ROOT / f).is_file() for f in target.files), target.files
    known = set().union(*(_functions(ROOT / f) for f in target.files))
    for pattern in target.mutants:
        function = pattern.removesuffix("__mutmut_*")
        assert any(fnmatch.fnmatchcase(k, function) for k in known), pattern
    for test in target.tests:
        assert (ROOT / test.split("::")[0]).exists(), test


def test_every_test_id_a_target_names_is_collected() -> None:
    """A test named with its parameters (``test_x[postgresql-sync]``) is one pytest still
    collects: a renamed parameter would make mutmut's first run fail."""
    ids = sorted({t for target in MUTATE.TARGETS.values() for t in target.tests if "::" in t})
    found = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stdout[-2000:] + found.stderr[-2000:]
    collected = found.stdout.splitlines()
    for test in ids:
        assert any(line == test or line.startswith(test + "[") for line in collected), test
