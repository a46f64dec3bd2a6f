"""The packed-weights bundle of GPTQ, AWQ and compressed-tensors loads: a later load maps what the first packed.

The suite runs with the bundle off (``LOADER_MARLIN_PACKED_CACHE=0``, tests/conftest.py), so every other
packing test packs; these turn it on, each with a cache folder of its own.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader.errors import SettingError
from loader.testing import simulated_tp
from tests.helpers.awq_checkpoints import save_awq_checkpoint
from tests.helpers.compressed_tensors_checkpoints import save_ct_checkpoint
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.model_checks import random_ids
from tests.helpers.moe_packed_checkpoints import save_gptq_moe_checkpoint


@pytest.fixture
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The bundle on, in a folder of this test's own; returns the bundles' folder."""
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "marlin-packed"


WRITERS = {
    "gptq": lambda path: save_gptq_checkpoint("llama", path, bits=4, group_size=32, sym=False),
    "gptq-act-order-8bit": lambda path: save_gptq_checkpoint("qwen2", path, bits=8, group_size=32, sym=True,
                                                             desc_act=True),
    "awq": lambda path: save_awq_checkpoint("llama", path, group_size=32),
    "ct": lambda path: save_ct_checkpoint("qwen2", path, bits=4, group_size=32, sym=False),
    "gptq-moe": lambda path: save_gptq_moe_checkpoint("qwen3_moe", path),
}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def _bundle_digest(folder) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.bin"))}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_second_load_maps_what_the_first_packed_and_is_the_same_model(tmp_path, cache, monkeypatch, kind):
    path, _ = WRITERS[kind](tmp_path / kind)
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "0")
    packed = _state(loader.load_model(str(path), dtype="bfloat16"))
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "1")
    first, report = loader.load_model_with_report(str(path), dtype="bfloat16")
    written = report.quantization["packed_cache"]
    assert written["written"] and written["hits"] == 0 and written["misses"] > 0
    second, report = loader.load_model_with_report(str(path), dtype="bfloat16")
    mapped = report.quantization["packed_cache"]
    assert (mapped["hits"], mapped["misses"], mapped["written"]) == (written["misses"], 0, False)
    assert mapped["path"] == written["path"]
    _assert_same(_state(first), packed)
    _assert_same(_state(second), packed)
    ids = random_ids(second.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(second(ids), first(ids))


def test_a_kernel_from_the_bundle_is_planned_with_this_load_s_settings(tmp_path, cache, monkeypatch):
    """The bundle keeps packed bytes, not a plan: a dense budget given only to the second load is used by it."""
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    options = {"dtype": "float32", "quantization_options": {"exact_float32": True}}
    monkeypatch.setenv("LOADER_KERNEL_DENSE_BUDGET", "0")
    _, first = loader.load_model_with_report(str(path), **options)
    assert first.quantization["packed_cache"]["written"]
    monkeypatch.setenv("LOADER_KERNEL_DENSE_BUDGET", str(1 << 30))
    _, second = loader.load_model_with_report(str(path), **options)
    assert second.quantization["packed_cache"]["misses"] == 0
    name = "model.layers.0.self_attn.qkv_proj"
    assert set(first.quantization["layers"][name]["by_tokens"]["float32"].values()) == {"dequantize"}
    assert set(second.quantization["layers"][name]["by_tokens"]["float32"].values()) == {"dense"}


def test_a_mapped_load_reads_no_quantized_tensor_of_the_checkpoint(tmp_path, cache):
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    _, first = loader.load_model_with_report(str(path), dtype="bfloat16")
    _, second = loader.load_model_with_report(str(path), dtype="bfloat16")
    quantized = sum(t.numel() * t.element_size() for f in path.glob("*.safetensors")
                    for name, t in load_file(str(f)).items() if name.endswith(("qweight", "qzeros", "scales")))
    assert first.bytes_read - second.bytes_read == quantized


@pytest.mark.parametrize("change", ["file touched", "dtype", "kernel option"])
def test_a_changed_file_or_option_misses_and_packs_again(tmp_path, cache, change):
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    options = {"dtype": "bfloat16"}
    loader.load_model(str(path), **options)
    if change == "file touched":
        shard = next(path.glob("*.safetensors"))
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1_000_000))
    elif change == "dtype":
        options["dtype"] = "float32"
    else:
        options["quantization_options"] = {"kernel": "int4pack"}
    _, again = loader.load_model_with_report(str(path), **options)
    assert again.quantization["packed_cache"]["hits"] == 0, change
    assert again.quantization["packed_cache"]["written"]


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tensor_parallel_rank_has_its_own_bundle(tmp_path, cache, monkeypatch, rank):
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    with simulated_tp(rank, 2):
        monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "0")
        expected = _state(loader.load_model(str(path), dtype="bfloat16"))
        monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "1")
        first = loader.load_model_with_report(str(path), dtype="bfloat16")[1].quantization["packed_cache"]
        got, report = loader.load_model_with_report(str(path), dtype="bfloat16")
    assert report.quantization["packed_cache"]["misses"] == 0
    _assert_same(_state(got), expected)
    _, whole = loader.load_model_with_report(str(path), dtype="bfloat16")  # tp=1 is another variant
    assert whole.quantization["packed_cache"]["path"] != first["path"]
    assert whole.quantization["packed_cache"]["hits"] == 0


def test_an_update_of_a_mapped_model_changes_the_model_not_the_bundle(tmp_path, cache):
    """A live update repacks into the layers' buffers, the bundle's copy-on-write pages: the model computes
    with the new weights, the bundle file keeps its bytes, and the next load of the files maps the old ones."""
    path_a, _ = WRITERS["gptq"](tmp_path / "a")
    path_b, _ = save_gptq_checkpoint("llama", tmp_path / "b", bits=4, group_size=32, sym=False, seed=1)
    first, report = loader.load_model_with_report(str(path_a), dtype="bfloat16")  # writes the bundle
    original = _state(first)
    digest = _bundle_digest(cache)
    model, report = loader.load_model_with_report(str(path_a), dtype="bfloat16")
    assert report.quantization["packed_cache"]["misses"] == 0
    tensors = {name: t for f in sorted(path_b.glob("*.safetensors")) for name, t in load_file(str(f)).items()}
    loader.update_weights(model, tensors)
    assert _bundle_digest(cache) == digest  # the update wrote no bundle, and not through the map
    _assert_same(_state(model), _state(loader.load_model(str(path_b), dtype="bfloat16")))
    again, report = loader.load_model_with_report(str(path_a), dtype="bfloat16")
    assert report.quantization["packed_cache"]["misses"] == 0
    _assert_same(_state(again), original)


def test_without_the_bundle_nothing_is_written(tmp_path, cache, monkeypatch):
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "0")
    _, report = loader.load_model_with_report(str(path), dtype="bfloat16")
    assert report.quantization["packed_cache"] is None
    assert not cache.exists()


def test_a_variable_that_is_not_yes_or_no_or_a_byte_count_is_refused_by_name(tmp_path, cache, monkeypatch):
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "sometimes")
    with pytest.raises(SettingError, match=r"^LOADER_MARLIN_PACKED_CACHE='sometimes': expected a yes/no value \("):
        loader.load_model(str(path))
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "1")
    monkeypatch.setenv("LOADER_MARLIN_CACHE_MAX_BYTES", "lots")
    with pytest.raises(SettingError, match=r"^LOADER_MARLIN_CACHE_MAX_BYTES='lots': expected a whole number of "
                                           r"bytes"):
        loader.load_model(str(path))


def test_a_model_loaded_with_the_bundle_can_be_saved_whole_and_loaded_back(tmp_path, cache):
    """``torch.save(model)`` pickles the load's config with every layer's method: nothing of the bundle (its
    map) may stay in it once the load is done."""
    path, _ = WRITERS["gptq"](tmp_path / "gptq")
    for load in ("writes", "maps"):
        model = loader.load_model(str(path), dtype="bfloat16")
        saved = tmp_path / f"{load}.pt"
        torch.save(model, saved)
        back = torch.load(saved, weights_only=False)
        ids = random_ids(model.config.vocab_size)
        with torch.no_grad():
            assert torch.equal(back(ids), model(ids)), load


def test_the_salt_names_every_module_of_the_plugin_and_the_core_s_packing_code() -> None:
    """An edited format, kernel choice or packer (this plugin's or the core's, C included) is another bundle."""
    from pathlib import Path

    from loader.kernels import packed_layout_fingerprint, packing_salt
    from loader_plugin_marlin import packed_cache

    modules = sorted(Path(packed_cache.__file__).resolve().parent.glob("*.py"))
    assert {"word_packing.py", "kernels.py", "gptq_format.py"} <= {path.name for path in modules}
    assert packed_cache._salt() == packing_salt(modules, format=packed_cache.FORMAT)
    assert packed_cache._salt()["core"] == packed_layout_fingerprint()
