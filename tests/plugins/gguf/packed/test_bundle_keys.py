"""The packed-weights bundle: a later load of a GGUF file maps what the first one packed, bit for bit.

The suite runs with the bundle off (``LOADER_GGUF_PACKED_CACHE=0``, tests/conftest.py), so every other
packing test packs; these turn it on, each with a cache folder of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time

import pytest
import torch

import loader
from loader.errors import PluginError, SettingError, UnsupportedError
from loader.testing import simulated_tp
from loader_plugin_gguf.packed import bundle_keys as packed_cache
from loader_plugin_gguf.packed.bundle_keys import MAGIC
from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config

_HEADER = struct.Struct("<8sQ")


@pytest.fixture
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The bundle on, in a folder of this test's own; returns the bundles' folder."""
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf-packed"


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in model.state_dict().items()}


def _assert_same_model(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    got_state, expected_state = _buffers(got), _buffers(expected)
    assert got_state.keys() == expected_state.keys()
    for name, tensor in expected_state.items():
        assert got_state[name].dtype == tensor.dtype, name
        assert torch.equal(got_state[name], tensor), name


def _mapped_range(path: str) -> tuple[int, int]:
    """Where this process maps the file at ``path`` (``/proc/self/maps``)."""
    inode = os.stat(path).st_ino
    for line in open("/proc/self/maps").read().splitlines():  # noqa: SIM115 - read at once
        fields = line.split()
        if len(fields) >= 6 and int(fields[4]) == inode and fields[5] == path:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            return low, high
    raise AssertionError(f"{path} is not mapped")


def _bundles(folder) -> list:  # type: ignore[no-untyped-def]
    return sorted(folder.glob("*.bin")) if folder.exists() else []


_K_M = {"blk.0.attn_v.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q6_K, "blk.1.attn_output.weight": Q.Q5_0,
        "output.weight": Q.Q6_K}
_WIDE = {"hidden_size": 256, "intermediate_size": 512}  # K-quant super-blocks are 256 wide


@pytest.mark.parametrize(("family", "qtype", "overrides", "kernels"), [
    ("llama", Q.Q4_1, {}, {"int4": 8, "blocks": 1, "blocks+int4": 1}),
    ("llama", Q.Q4_0, {}, {"int4": 8, "blocks": 1, "blocks+int4": 1}),
    ("qwen2", Q.Q8_0, {}, {"int4x2": 9}),
    ("llama", Q.Q8_0, {}, {"int4x2": 9, "int8": 1}),
    ("llama", Q.Q4_K, _WIDE, {"int4": 8, "blocks": 1, "blocks+int4": 1}),
    ("llama", Q.Q4_K, {**_WIDE, "quantized_as": _K_M},
     {"blocks": 1, "dequantized": 2, "int4": 5, "int4+dequantized": 1, "int8": 1}),
], ids=["llama-q4_1", "llama-q4_0", "qwen2-q8_0-tied", "llama-q8_0", "llama-q4_k", "llama-q4_k_m-segments"])
def test_a_second_load_maps_the_bundle_the_first_wrote_and_is_the_same_model(tiny_gguf, cache, family, qtype,
                                                                              overrides, kernels):
    if family == "llama":
        overrides = {"rope_scaling": None, **overrides}
    path, hf = tiny_gguf(family, qtype, **overrides)
    first, first_report = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    written = first_report.quantization["packed_cache"]
    assert first_report.quantization["kernels"] == kernels
    units = written["misses"]
    assert units >= 6 and written["hits"] == 0 and written["written"] and written["notes"] == []
    assert [str(p) for p in _bundles(cache)] == [written["path"]]
    assert not list(cache.glob("*.tmp"))
    second, report = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    assert report.quantization["packed_cache"] == {**written, "hits": units, "misses": 0, "written": False}
    assert report.quantization["kernels"] == kernels
    assert report.quantization["packed_bytes"] == first_report.quantization["packed_bytes"]
    _assert_same_model(second, first)
    # the packed buffers lie in the bundle's map, not in fresh memory
    start, end = _mapped_range(written["path"])
    mapped = [t for name, t in _buffers(second).items() if "packed_weight" in name or "q8_planes" in name]
    assert mapped and all(start <= t.data_ptr() and t.data_ptr() + t.nbytes <= end for t in mapped)
    assert not any(start <= t.data_ptr() < end for t in _buffers(first).values())
    ids = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(second(ids), first(ids))


def test_without_the_bundle_the_load_packs_and_writes_nothing(tiny_gguf, cache, monkeypatch):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    _, report = loader.load_model_with_report(str(path), quantization="gguf",
                                              format_options={"packed_cache": False})
    assert report.quantization["packed_cache"] is None
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "0")
    _, report = loader.load_model_with_report(str(path), quantization="gguf")
    assert report.quantization["packed_cache"] is None
    assert _bundles(cache) == []
    # the option wins over the variable
    _, report = loader.load_model_with_report(str(path), quantization="gguf", format_options={"packed_cache": "yes"})
    assert report.quantization["packed_cache"]["written"]


def test_a_packed_cache_option_or_variable_that_is_not_yes_or_no_is_refused_by_name(tiny_gguf, cache, monkeypatch):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    with pytest.raises(UnsupportedError, match=r"format option packed_cache='maybe' is not a yes/no value"):
        loader.load_model(str(path), format_options={"packed_cache": "maybe"})
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "sometimes")
    with pytest.raises(SettingError, match=r"^LOADER_GGUF_PACKED_CACHE='sometimes': expected a yes/no value \("):
        loader.load_model(str(path))


def test_a_cache_size_that_is_not_a_byte_count_is_refused_by_name(tiny_gguf, cache, monkeypatch):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    monkeypatch.setenv("LOADER_GGUF_CACHE_MAX_BYTES", "lots")
    with pytest.raises(SettingError, match=r"^LOADER_GGUF_CACHE_MAX_BYTES='lots': expected a whole number of bytes"):
        loader.load_model(str(path))


def _write_tiny(path, qtype, seed):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    return write_gguf(path, model, "llama", qtype=qtype)


def test_a_file_changed_in_place_misses_and_is_packed_again(tmp_path, cache):
    path = _write_tiny(tmp_path / "m.gguf", Q.Q4_1, seed=0)
    loader.load_model(str(path), quantization="gguf")
    replaced = _write_tiny(tmp_path / "other.gguf", Q.Q4_1, seed=1)
    shutil.copyfile(replaced, path)  # same path (and likely size), other weights
    got, report = loader.load_model_with_report(str(path), quantization="gguf")
    assert report.quantization["packed_cache"]["hits"] == 0
    expected = loader.load_model(str(path), quantization="gguf", format_options={"packed_cache": False})
    _assert_same_model(got, expected)
    assert len(_bundles(cache)) == 2  # each version of the file has its own


def _rewrite_index(bundle, change) -> None:  # type: ignore[no-untyped-def]
    """Apply ``change`` to the bundle's JSON index, keeping its length (padded with spaces) and the data."""
    raw = bundle.read_bytes()
    _, length = _HEADER.unpack_from(raw)
    index = json.loads(raw[_HEADER.size:_HEADER.size + length])
    text = json.dumps(change(index)).encode()
    assert len(text) <= length
    bundle.write_bytes(raw[:_HEADER.size] + text + b" " * (length - len(text)) + raw[_HEADER.size + length:])


def _swap_first_shape(index):  # type: ignore[no-untyped-def]
    entries = next(iter(index["units"].values()))
    name, dtype, shape, offset = entries[0]
    entries[0] = [name, dtype, list(reversed(shape)), offset]
    return index


@pytest.mark.parametrize(("spoil", "note"), [
    (lambda b: b.write_bytes(b"not a bundle" * 4), "not a packed GGUF bundle (bad magic)"),
    (lambda b: b.write_bytes(b.read_bytes()[:-4096]), "its data should be"),
    (lambda b: b.write_bytes(b.read_bytes()[:20]), "runs past the end of the file"),
    (lambda b: b.write_bytes(MAGIC + struct.pack("<Q", 5) + b"{oops" + bytes(64)), "its index is not JSON"),
    (lambda b: _rewrite_index(b, lambda i: {**i, "salt": {**i["salt"], "core": "another torch"}}),
     "it was written for other files, packing code or options"),
    (lambda b: _rewrite_index(b, lambda i: {**i, "units": {k: [[1, 2]] for k in i["units"]}}), "a bad tensor entry"),
    (lambda b: _rewrite_index(b, lambda i: {**i, "units": {k: [["data", "uint8", [1 << 40], 0]]
                                                            for k in i["units"]}}), "lies outside"),
], ids=["magic", "truncated-data", "truncated-index", "index-not-json", "other-torch", "bad-entry", "outside"])
def test_a_bundle_that_cannot_be_used_is_reported_packed_again_and_rewritten(tiny_gguf, cache, spoil, note):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    expected, report = loader.load_model_with_report(str(path), quantization="gguf")
    bundle = _bundles(cache)[0]
    spoil(bundle)
    got, report = loader.load_model_with_report(str(path), quantization="gguf")
    described = report.quantization["packed_cache"]
    assert described["hits"] == 0 and described["written"]
    assert len(described["notes"]) == 1 and note in described["notes"][0], described["notes"]
    _assert_same_model(got, expected)
    _, report = loader.load_model_with_report(str(path), quantization="gguf")
    assert report.quantization["packed_cache"]["misses"] == 0  # the rewritten bundle is whole again


def test_a_stored_unit_whose_shapes_are_not_the_layer_s_is_packed_again(tiny_gguf, cache):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    expected = loader.load_model(str(path), quantization="gguf")
    _rewrite_index(_bundles(cache)[0], _swap_first_shape)
    got, report = loader.load_model_with_report(str(path), quantization="gguf")
    described = report.quantization["packed_cache"]
    assert described["misses"] == 1 and described["hits"] >= 9 and described["written"]
    assert len(described["notes"]) == 1
    assert "did not have the expected shapes; packed again" in described["notes"][0]
    _assert_same_model(got, expected)


def test_a_cache_folder_that_cannot_be_written_is_reported_and_the_load_goes_on(tiny_gguf, tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(blocked))
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    got, report = loader.load_model_with_report(str(path), quantization="gguf")
    described = report.quantization["packed_cache"]
    assert not described["written"] and described["misses"] >= 9
    assert len(described["notes"]) == 1 and "not written" in described["notes"][0]
    _assert_same_model(got, loader.load_model(str(path), quantization="gguf", format_options={"packed_cache": 0}))


def test_a_failed_load_writes_no_bundle(tiny_gguf, cache, monkeypatch):
    from loader_plugin_gguf.packed.linear_method import GGUFLinearMethod

    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    real = GGUFLinearMethod.process_weights_after_loading
    seen = []

    def failing(self, layer):  # type: ignore[no-untyped-def]
        seen.append(layer)
        if len(seen) == 5:
            raise RuntimeError("disk on fire")
        real(self, layer)

    monkeypatch.setattr(GGUFLinearMethod, "process_weights_after_loading", failing)
    with pytest.raises(PluginError, match="RuntimeError: disk on fire"):
        loader.load_model(str(path), quantization="gguf")
    assert _bundles(cache) == [] and not (cache.exists() and list(cache.iterdir()))


def test_a_loaded_model_written_to_does_not_change_the_bundle(tiny_gguf, cache):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    expected = loader.load_model(str(path), quantization="gguf")
    mapped = loader.load_model(str(path), quantization="gguf")
    for name, tensor in _buffers(mapped).items():
        if "packed" in name:
            tensor.zero_()  # a copy-on-write map: the bundle keeps its bytes
    _assert_same_model(loader.load_model(str(path), quantization="gguf"), expected)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tensor_parallel_rank_has_its_own_bundle(tiny_gguf, cache, rank):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    with simulated_tp(rank, 2):
        expected = loader.load_model(str(path), quantization="gguf", format_options={"packed_cache": False})
        first = loader.load_model_with_report(str(path), quantization="gguf")[1].quantization["packed_cache"]
        got, report = loader.load_model_with_report(str(path), quantization="gguf")
    assert report.quantization["packed_cache"]["misses"] == 0
    _assert_same_model(got, expected)
    _, other = loader.load_model_with_report(str(path), quantization="gguf")  # tp=1 is another variant
    assert other.quantization["packed_cache"]["path"] != first["path"]
    assert other.quantization["packed_cache"]["hits"] == 0


def test_bundles_beyond_the_size_limit_go_least_recently_used_first(tmp_path, cache, monkeypatch):
    paths = [_write_tiny(tmp_path / f"m{i}.gguf", Q.Q4_1, seed=i) for i in range(3)]
    for path in paths:
        loader.load_model(str(path), quantization="gguf")
    first, second, third = (loader.load_model_with_report(str(p), quantization="gguf")[1]
                            .quantization["packed_cache"]["path"] for p in paths)
    old = time.time() - 100
    os.utime(first, (old, old))  # the least recently used
    stale = cache / "abc.def.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (old - 7200, old - 7200))
    fresh_temp = cache / "abd.def.tmp"
    fresh_temp.write_bytes(b"x")
    size = os.path.getsize(second)
    monkeypatch.setenv("LOADER_GGUF_CACHE_MAX_BYTES", str(2 * size + size // 2))
    fourth = _write_tiny(tmp_path / "m3.gguf", Q.Q4_1, seed=3)
    written = loader.load_model_with_report(str(fourth), quantization="gguf")[1].quantization["packed_cache"]["path"]
    # four equal bundles over a limit of 2.5: the two least recently used go (each load that hit touched its own)
    assert {str(p) for p in _bundles(cache)} == {third, written}
    assert not stale.exists() and fresh_temp.exists()


def test_the_salt_names_the_plugin_s_packing_code_and_the_core_s_layout() -> None:
    from loader.kernels import packed_layout_fingerprint

    salt = packed_cache._salt()
    assert salt == {"format": packed_cache.FORMAT, "code": salt["code"], "core": packed_layout_fingerprint()}
    assert len(salt["code"]) == 64 and len(salt["core"]) == 64


def test_a_unit_is_keyed_only_when_every_part_lies_in_the_files_that_name_the_bundle(tiny_gguf):
    from loader.weights import ReadStats
    from loader_plugin_gguf.format.weight_stream import iter_gguf_weights
    from loader_plugin_gguf.packed.bundle_keys import unit_key

    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    tensors = dict(iter_gguf_weights([str(path)], ReadStats()))
    down = tensors["model.layers.0.mlp.down_proj.weight"]
    key = unit_key("int4", torch.bfloat16, [down], [str(path)])
    assert key is not None and str(path) in key and "Q4_1" in key
    assert unit_key("int4", torch.bfloat16, [down], ["/elsewhere/other.gguf"]) is None
    # another window of the same tensor, another dtype or another kernel is another unit
    assert unit_key("int4", torch.bfloat16, [down.narrow(0, 0, 32)], [str(path)]) != key
    assert unit_key("int4", torch.float16, [down], [str(path)]) != key
    assert unit_key("int4x2", torch.bfloat16, [down], [str(path)]) != key


def test_the_load_s_config_keeps_no_unit_alive_once_the_load_is_done(tiny_gguf, cache):
    """Every layer's method keeps the load's config: after the load it must not hold the packed tensors too, or a
    ``module.to(...)`` that replaces them would keep both copies."""
    import gc
    import weakref

    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    for _ in range(2):  # the load that writes the bundle, then the one that maps it
        model = loader.load_model(str(path), quantization="gguf")
        layer = model.model.layers[0].mlp.down_proj
        gone = weakref.ref(layer.packed_weight)
        layer.packed_weight = layer.packed_weight.clone()
        gc.collect()
        assert gone() is None


def test_a_model_loaded_with_the_bundle_can_be_saved_whole_and_loaded_back(tiny_gguf, cache, tmp_path):
    """``torch.save(model)`` pickles every module, their quant methods and the load's config with them: nothing of
    the bundle (its lock, its map) may stay in the config once the load is done."""
    path, hf = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    ids = torch.randint(0, hf.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    for load in ("writes", "maps"):
        model = loader.load_model(str(path), quantization="gguf")
        saved = tmp_path / f"{load}.pt"
        torch.save(model, saved)
        back = torch.load(saved, weights_only=False)
        with torch.no_grad():
            assert torch.equal(back(ids), model(ids)), load
