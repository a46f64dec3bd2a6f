"""loader.layers re-exports its building blocks lazily, and exactly what the type checker is told it does."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import loader.layers as layers
from tests.helpers.lazy_packages import typed_homes


def _typed_homes() -> dict[str, str]:
    return typed_homes(layers)


def test_exports_are_exactly_what_the_type_checker_sees() -> None:
    homes = _typed_homes()
    assert sorted(homes) == sorted(layers.__all__)
    assert len(layers.__all__) == len(set(layers.__all__))


@pytest.mark.parametrize("name", layers.__all__)
def test_each_name_resolves_to_the_object_its_typed_home_defines(name: str) -> None:
    home = importlib.import_module(f"loader.layers.{_typed_homes()[name]}")
    assert getattr(layers, name) is getattr(home, name)


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        layers.Nope  # noqa: B018


LAZY = """
import json, sys
import loader.layers as layers
def loaded():
    return sorted(m for m in sys.modules if m == "torch" or m.startswith("loader.layers."))
steps = {"import": loaded()}
layers.QuantizationConfig
steps["QuantizationConfig"] = loaded()
layers.RMSNorm
steps["RMSNorm"] = [m for m in loaded() if m in ("torch", "loader.layers.layernorm")]
print(json.dumps(steps))
"""


def test_names_are_imported_on_first_access_and_quantization_without_torch() -> None:
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, check=True)
    steps = json.loads(done.stdout)
    assert steps["import"] == []
    # the quantization bases (and the parameter layout record they use) import without torch
    assert "torch" not in steps["QuantizationConfig"]
    assert "loader.layers.quantization" in steps["QuantizationConfig"]
    assert set(steps["QuantizationConfig"]) <= {"loader.layers.quantization", "loader.layers.param_layout"}
    assert steps["RMSNorm"] == ["loader.layers.layernorm", "torch"]
