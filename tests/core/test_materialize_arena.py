"""The small-tensor arena does not fault in a 2 MiB huge page for a few KiB of norms and rotary tables.

Large tensors get regions of their own, advised for huge pages; the arena that
holds the rest (norm weights, rotary tables: ~70 KiB for a 1 GB Llama) used to
be advised too, so the first write into it (the rotary table, computed before
any weight is read) could fault in a whole 2 MiB page: 2 MiB more peak RSS than
``transformers.from_pretrained`` on the fallback benchmark.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from torch import nn

from loader._pipeline.materialize import _cpu_arena, materialize
from loader.layers.quantization import QuantizeMethodBase

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(),
                               reason="no transparent huge pages here")


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


class _Shaped(nn.Module):
    """Eight 4 MiB matrices (regions of their own) and 17 norms plus a rotary table (the arena)."""

    def __init__(self) -> None:
        super().__init__()
        self.large = nn.ParameterList([nn.Parameter(torch.empty(1024, 1024)) for _ in range(8)])
        self.norms = nn.ParameterList([nn.Parameter(torch.empty(1024)) for _ in range(17)])
        self.register_buffer("inv_freq", torch.empty(64), persistent=False)


@needs_thp
def test_writing_a_rotary_table_into_the_arena_costs_pages_not_a_huge_page():
    with torch.device("meta"):
        model = _Shaped()
    materialize(model, torch.device("cpu"))
    before = _rss_anon_kib()
    model.inv_freq.fill_(1.0)
    assert _rss_anon_kib() - before < 1024


@needs_thp
def test_an_arena_of_several_huge_pages_is_still_advised_for_them(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOADER_HUGE_PAGES", "1")
    arena = _cpu_arena(6 << 20)
    before = _rss_anon_kib()
    arena[:1].fill_(1)  # one byte faults in a whole huge page where the advice holds
    assert _rss_anon_kib() - before >= 2048


@needs_thp
def test_without_huge_pages_a_byte_of_the_arena_costs_a_small_page(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOADER_HUGE_PAGES", "0")
    arena = _cpu_arena(6 << 20)
    before = _rss_anon_kib()
    arena[:1].fill_(1)
    assert _rss_anon_kib() - before < 1024


class _Replacing(QuantizeMethodBase):
    """A quantize method that replaces its layer's tensors after loading (as GPTQ's does)."""

    def create_weights(self, layer: nn.Module, *args: object, **kwargs: object) -> None:
        raise NotImplementedError

    def apply(self, layer: nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for name in [n for n, _ in layer.named_parameters(recurse=False)]:
            delattr(layer, name)
        layer.register_buffer("packed", torch.zeros(16, dtype=torch.uint8))


class _Quantized(nn.Module):
    """Sixteen 256 KiB checkpoint tensors (below the 1 MiB of a region: arena) next to a norm that stays."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Module()
        for i in range(16):
            self.layer.register_parameter(f"scales{i}", nn.Parameter(torch.empty(64 * 1024), requires_grad=False))
        self.layer.quant_method = _Replacing()
        self.norm = nn.Parameter(torch.empty(1024))


def test_small_tensors_a_quantize_method_drops_leave_the_resident_set():
    """They used to share the norms' arena, whose written pages stay resident while the norms live."""
    with torch.device("meta"):
        model = _Quantized()
    materialize(model, torch.device("cpu"))
    for param in model.parameters():
        param.data.fill_(1.0)
    del param  # the loop's last one is a scales tensor
    before = _rss_anon_kib()
    model.layer.quant_method.process_weights_after_loading(model.layer)
    gc.collect()
    assert before - _rss_anon_kib() >= 3 * 1024  # of the 4 MiB written
    assert float(model.norm.sum()) == 1024.0


def test_post_processed_layers_share_arenas_when_memory_maps_run_short(monkeypatch):
    """One arena per layer unless that would exceed the memory-map budget; the kept tensors never share one."""
    from loader._pipeline import materialize as materialize_module

    class _Layers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList()
            for _ in range(5):
                layer = nn.Module()
                layer.register_parameter("scales", nn.Parameter(torch.empty(1024), requires_grad=False))
                layer.quant_method = _Replacing()
                self.layers.append(layer)
            self.norm = nn.Parameter(torch.empty(1024))

    def arenas(model: nn.Module) -> list[int]:
        return [layer.scales.untyped_storage().data_ptr() for layer in model.layers]

    with torch.device("meta"):
        roomy, tight = _Layers(), _Layers()
    materialize(roomy, torch.device("cpu"))
    assert len(set(arenas(roomy))) == 5
    monkeypatch.setattr(materialize_module, "region_budget", lambda: 2)
    materialize(tight, torch.device("cpu"))
    found = arenas(tight)
    assert found[0] == found[1] == found[2] and found[3] == found[4] and found[0] != found[3]
    assert tight.norm.untyped_storage().data_ptr() not in found


def test_empty_tensors_of_post_processed_layers_take_no_arena(monkeypatch):
    """A method that registers a 0-byte placeholder (GGUF: the blocks are read at post-processing) gets an
    empty CPU tensor, not a memory map of its own: SmolLM2's 120 such layers spent ~6 ms of a load mapping them."""
    from loader._pipeline import materialize as materialize_module

    arenas: list[int] = []
    real = materialize_module._cpu_arena
    monkeypatch.setattr(materialize_module, "_cpu_arena", lambda nbytes: arenas.append(nbytes) or real(nbytes))

    class _Placeholders(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList()
            for _ in range(4):
                layer = nn.Module()
                layer.register_parameter("weight", nn.Parameter(torch.empty(0, dtype=torch.uint8),
                                                                requires_grad=False))
                layer.weight.marker = "kept"  # type: ignore[attr-defined]
                layer.quant_method = _Replacing()
                self.layers.append(layer)
            self.norm = nn.Parameter(torch.empty(1024))

    with torch.device("meta"):
        model = _Placeholders()
    materialize(model, torch.device("cpu"))
    assert arenas == [4096]  # the norm's, nothing for the placeholders
    for layer in model.layers:
        assert layer.weight.device.type == "cpu" and layer.weight.shape == (0,) and layer.weight.dtype == torch.uint8
        assert layer.weight.marker == "kept"


@pytest.mark.parametrize("arena", [True, False])
def test_materializing_does_not_import_sympy(arena):
    """``torch.empty_like`` of a ``meta`` tensor imports sympy and mpmath (~490 modules, ~38 MB of RSS, tens of
    ms in a fresh process); plain ``torch.empty`` of its shape does not."""
    import subprocess
    import sys

    code = f"""
import sys, torch
from torch import nn
from loader._pipeline.materialize import materialize
from loader.layers.quantization import QuantizeMethodBase
with torch.device("meta"):
    model = nn.Module()
    model.placeholder = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    model.norm = nn.Parameter(torch.empty(8))
assert "sympy" not in sys.modules
materialize(model, torch.device("cpu"), arena={arena})
assert model.placeholder.device.type == "cpu" and model.norm.device.type == "cpu"
print("sympy" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
