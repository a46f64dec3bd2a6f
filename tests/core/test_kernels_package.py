"""loader.kernels re-exports its kernels lazily, and exactly what the type checker is told it does."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import loader.kernels as kernels
from tests.helpers.lazy_packages import typed_homes


def _typed_homes() -> dict[str, str]:
    return typed_homes(kernels)


def test_exports_are_exactly_what_the_type_checker_sees() -> None:
    homes = _typed_homes()
    assert sorted(homes) == sorted(kernels.__all__)
    assert len(kernels.__all__) == len(set(kernels.__all__))


@pytest.mark.parametrize("name", kernels.__all__)
def test_each_name_resolves_to_the_object_its_typed_home_defines(name: str) -> None:
    home = importlib.import_module(f"loader.kernels.{_typed_homes()[name]}")
    assert getattr(kernels, name) is getattr(home, name)


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        kernels.Nope  # noqa: B018


LAZY = """
import json, sys
import loader.kernels as kernels
def loaded():
    return sorted(m for m in sys.modules if m == "torch" or m.startswith("loader.kernels."))
steps = {"import": loaded()}
kernels.KernelChoice
steps["KernelChoice"] = loaded()
kernels.pack_int4
steps["pack_int4"] = loaded()
print(json.dumps(steps))
"""


def test_names_are_imported_on_first_access_and_the_choice_record_without_torch() -> None:
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, check=True)
    steps = json.loads(done.stdout)
    assert steps["import"] == []
    assert steps["KernelChoice"] == ["loader.kernels.choice", "loader.kernels.token_plan"]  # both light
    assert {"torch", "loader.kernels.int4_cpu"} <= set(steps["pack_int4"])
