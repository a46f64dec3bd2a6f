"""loader.layers re-exports its building blocks lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import loader.layers as layers


def test_every_exported_name_resolves():
    for name in layers.__all__:
        assert getattr(layers, name) is not None, name
    assert sorted(dir(layers)) == sorted(layers.__all__)


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        layers.Nope  # noqa: B018


def test_quantization_module_imports_without_torch():
    code = "import sys, loader.layers.quantization; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
