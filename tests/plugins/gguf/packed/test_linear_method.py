"""``quantization="gguf"``: Q4_0/Q4_1 blocks kept packed for torch's int4 CPU kernel, checked against gguf-py.

The weight a packed layer represents is read back by multiplying the identity
in float32 (the kernel then widens its bfloat16 scales exactly): it is
``(q - 8) * bf16(d) + bf16(bias + 8 d)`` from gguf-py's own block fields, so
for Q4_0 it is bit-equal to gguf-py's dequantization with ``d`` rounded to
bfloat16, and for both types within that rounding (``2^-8 (8 |d| + |z|)``) of
gguf-py's dequantization as stored.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import loader
from loader._pipeline.plan import plan_layers
from loader.errors import UnsupportedError
from loader.kernels import Int8GroupedWeight
from loader.testing import simulated_tp
from loader_plugin_gguf.packed.linear_method import GGUFLinearMethod
from loader_plugin_gguf.packed.plan import int4_packed_bytes
from loader_plugin_gguf.packed.q4_blocks import decode_q4
from tests.helpers.gguf_files import Q
from tests.helpers.hf_checkpoints import relative_error

HEADS = 4  # tiny_config's Llama: hidden 64, 4 heads of 16, 2 KV heads


def _packed(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The float32 ``[N, K]`` weight the packed layer ``name`` represents."""
    layer = dict(model.named_modules())[name]
    method = layer.quant_method
    assert isinstance(method, GGUFLinearMethod)
    weight = method.int4_weight(layer)
    assert weight is not None, method.config.layer_log
    return weight.matmul(torch.eye(weight.in_features)).t()


def _gguf_py(path, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """gguf-py's dequantization of tensor ``name`` and its raw blocks."""
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    raw = np.array(tensor.data)
    return gguf.quants.dequantize(raw, tensor.tensor_type), raw, int(tensor.tensor_type)


def _half_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary interleave (the inverse of ``tests.helpers.gguf_files.interleave_rotary``)."""
    return weight.reshape(heads, -1, 2, weight.shape[-1]).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize(("gguf_name", "layer", "rows"), [
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj", slice(None)),
    ("blk.1.attn_q.weight", "model.layers.1.self_attn.qkv_proj", slice(0, 64)),
    ("blk.1.attn_k.weight", "model.layers.1.self_attn.qkv_proj", slice(64, 96)),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.gate_up_proj", slice(128, 256)),
], ids=["down", "q-permuted", "k-permuted", "up-fused"])
def test_packed_weight_is_gguf_py_dequantization_with_scales_rounded_to_bfloat16(
        tiny_gguf, qtype, gguf_name, layer, rows, packing):
    path, _ = tiny_gguf("llama", qtype, rope_scaling=None)
    model = loader.load_model(str(path), dtype="float32", quantization="gguf")
    got = _packed(model, layer)[rows]
    expected, raw, ggml_type = _gguf_py(path, gguf_name)
    fields = decode_q4(torch.from_numpy(raw), ggml_type)
    d = fields.scales.t().repeat_interleave(32, 1)
    z = (fields.biases + 8 * fields.scales).t().repeat_interleave(32, 1)
    rounded = (fields.codes.float() - 8) * d.bfloat16().float() + z.bfloat16().float()
    if "attn_q" in gguf_name or "attn_k" in gguf_name:
        heads = HEADS if "attn_q" in gguf_name else 2
        expected = _half_rotary(expected, heads)
        rounded, d, z = (torch.from_numpy(_half_rotary(t.numpy(), heads)) for t in (rounded, d, z))
    assert torch.equal(got, rounded)
    assert bool(((got - torch.from_numpy(expected)).abs() <= 2**-8 * (8 * d.abs() + z.abs())).all())
    if qtype == Q.Q4_0:  # z = 0, so ``got`` is exactly gguf-py's d * (q - 8) with d rounded to bfloat16
        assert bool((z == 0).all())


@pytest.mark.parametrize(("family", "qtype"), [("llama", Q.Q4_0), ("llama", Q.Q4_1), ("qwen2", Q.Q4_1)],
                         ids=["llama-q4_0", "llama-q4_1", "qwen2-q4_1"])
def test_packed_logits_agree_with_the_dequantized_float32_model(tiny_gguf, family, qtype):
    path, model = tiny_gguf(family, qtype, **({"rope_scaling": None} if family == "llama" else {}))
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    packed, report = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    with torch.no_grad():
        expected = loader.load_model(str(path), dtype="float32")(ids)
        got = packed(ids)
    # the llama's own output head kept too (qwen2's is tied to its embedding)
    assert report.quantization["kernels"] == ({"int4": 8, "blocks+int4": 1} if family == "qwen2" else
                                              {"int4": 8, "blocks": 1, "blocks+int4": 1})
    assert report.quantization["packed_bytes"] > 0
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.98
    assert relative_error(got, expected) <= 3e-2


def test_other_block_types_fall_back_per_layer_with_the_reason(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q5_0, rope_scaling=None)
    ids = torch.arange(12).view(1, 12)
    model, report = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    layers = report.quantization["layers"]
    # the embedding keeps its Q5_0 blocks; the untied Q5_0 head has no kernel and stays a dense table
    assert report.quantization["kernels"] == {"dequantized": 8, "blocks": 1}
    assert layers["model.layers.0.mlp.down_proj"]["reason"] == "ggml type Q5_0 has no packed int4 kernel"
    assert layers["model.layers.0.self_attn.qkv_proj"]["reason"] == "part 'q': ggml type Q5_0 has no packed " \
        "int4 kernel"
    with torch.no_grad():
        got, expected = model(ids), loader.load_model(str(path), dtype="float32")(ids)
    # float32 by name: the dequantized linears and the head are the dense model's
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("gguf_name", "layer", "rows"), [
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj", slice(None)),
    ("blk.1.attn_q.weight", "model.layers.1.self_attn.qkv_proj", slice(0, 64)),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.gate_up_proj", slice(128, 256)),
], ids=["down", "q-permuted", "up-fused"])
def test_q8_0_linears_keep_their_codes_as_two_int4_planes(tiny_gguf, gguf_name, layer, rows, packing):
    """Q8_0 layers run on the int4 kernel as two nibble planes (``int4x2``): a byte a value, and the weight is
    gguf-py's dequantization with each block's ``d`` rounded to bfloat16 (codes read back from the planes)."""
    path, _ = tiny_gguf("llama", Q.Q8_0, rope_scaling=None)
    model, report = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    # the linears and the untied head as planes; the embedding alone keeps int8 codes (it is only looked up)
    assert report.quantization["kernels"] == {"int4x2": 9, "int8": 1}
    module = dict(model.named_modules())[layer]
    weight = module.quant_method.int4_weight(module)
    assert isinstance(weight, Int8GroupedWeight)
    n = weight.out_features
    codes = weight.codes(torch.arange(n)).float()[rows]
    d = weight.planes.scales_and_zeros[:, n:, 0].float().t().repeat_interleave(32, 1)[rows]  # bfloat16(d)
    expected, raw, _ = _gguf_py(path, gguf_name)
    blocks = torch.from_numpy(raw).reshape(raw.shape[0], -1, 34)
    file_codes = blocks[:, :, 2:].contiguous().view(torch.int8).reshape(raw.shape[0], -1).float()
    file_d = blocks[:, :, :2].contiguous().view(torch.float16)[..., 0].float().repeat_interleave(32, 1)
    if "attn_q" in gguf_name:
        expected, file_codes, file_d = (torch.from_numpy(_half_rotary(np.asarray(t), HEADS))
                                        for t in (expected, file_codes, file_d))
    assert torch.equal(codes, file_codes)
    assert torch.equal(d, file_d.bfloat16().float())
    assert bool(((codes * d - torch.from_numpy(np.asarray(expected))).abs() <= 2**-8 * 128 * file_d.abs()).all())
    x = torch.randn(3, weight.in_features, generator=torch.Generator().manual_seed(0))
    got = module(x)
    dense = (weight.codes(torch.arange(n)).float() *
             weight.planes.scales_and_zeros[:, n:, 0].float().t().repeat_interleave(32, 1))
    reference = x.bfloat16().float() @ dense.t()
    assert relative_error(got, reference) <= 1e-2  # each plane's sums rounded to bfloat16 once


def test_a_q8_0_model_runs_on_the_planes_and_agrees_with_float32(tiny_gguf):
    path, model = tiny_gguf("qwen2", Q.Q8_0)
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    packed, report = loader.load_model_with_report(str(path))
    assert report.quantization["kernels"] == {"int4x2": 9}  # 8 linears and the tied embedding/head
    assert report.quantization["packed_bytes"] < 1.3 * path.stat().st_size
    with torch.no_grad():
        got, expected = packed(ids), loader.load_model(str(path), dtype="float32")(ids)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.98
    assert relative_error(got, expected) <= 3e-2


def test_q8_0_linears_with_the_float32_kernel_are_dequantized_with_the_reason(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q8_0, rope_scaling=None)
    _, report = loader.load_model_with_report(str(path), format_options={"kernel_dtype": "float32"})
    record = report.quantization["layers"]["model.layers.0.mlp.down_proj"]
    assert record["kernel"] == "dequantized"
    assert record["reason"] == "ggml type Q8_0 runs as two int4 planes only in bfloat16/float16"


def test_a_default_load_dequantizes_what_cannot_stay_packed_to_bfloat16_and_float_tensors_to_float32(tmp_path):
    """A Q4_K_M-style file (Q6_K and Q5_0 layers among Q4_K): with dtype auto those layers hold bfloat16, half
    of float32's bytes, and compute in it (activations cast as for the packed kernel); an F16 layer keeps
    float32; ``dtype="float32"`` by name keeps float32 everywhere, exactly as before."""
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    config = tiny_config("llama", vocab_size=288, hidden_size=256, intermediate_size=512, rope_scaling=None)
    types = {"blk.0.attn_v.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q6_K, "blk.1.attn_output.weight": Q.Q5_0,
             "blk.1.ffn_down.weight": Q.F16, "output.weight": Q.Q6_K}
    path = write_gguf(tmp_path / "k_m.gguf", build_model("llama", config), "llama", qtype=Q.Q4_K,
                      quantized_as=types)
    model, report = loader.load_model_with_report(str(path))
    modules = dict(model.named_modules())
    layers = report.quantization["layers"]
    assert report.quantization["dense_dtype"] == "bfloat16"
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"):
        assert layers[name]["kernel"] == "dequantized" and layers[name]["dtype"] == "bfloat16", name
        assert modules[name].weight.dtype == torch.bfloat16
    # the Q6_K v beside Q4_K q and k: q and k stay packed, v alone is dequantized (to bfloat16)
    qkv = layers["model.layers.0.self_attn.qkv_proj"]
    assert qkv["kernel"] == "int4+dequantized" and qkv["dtype"] == "bfloat16"
    assert qkv["reason"] == "part 'v': ggml type Q6_K has no packed int4 kernel"
    qkv_layer = modules["model.layers.0.self_attn.qkv_proj"]
    assert [(s.start, s.rows, s.kernel) for s in qkv_layer.quant_method.segments(qkv_layer)] == [
        (0, 256 + 128, "int4"), (384, 128, "dequantized")]
    assert qkv_layer.segment1_weight.dtype == torch.bfloat16
    assert layers["model.layers.1.mlp.down_proj"]["dtype"] == "float32"
    assert modules["model.layers.1.mlp.down_proj"].weight.dtype == torch.float32
    # the untied Q6_K head: int8 codes and scales per 16-value group, 1.4 bytes a value, not a float32 table
    assert layers["lm_head"]["kernel"] == "int8" and layers["lm_head"]["types"] == ("Q6_K",)
    assert not any(name.startswith("lm_head") for name, _ in model.named_parameters())
    rows, groups = 320, 256 // 16  # the vocabulary padded to 64 rows; codes, float32 scales, bfloat16 copy
    assert layers["lm_head"]["packed_bytes"] == rows * 256 + rows * groups * (4 + 2)
    ids = torch.randint(0, 288, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = loader.load_model(str(path), dtype="float32")(ids)
        got = model(ids)
    assert got.dtype == torch.float32
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.98
    assert relative_error(got, expected) <= 3e-2
    kept_float32, forced = loader.load_model_with_report(str(path), dtype="float32", quantization="gguf")
    assert forced.quantization["dense_dtype"] is None
    assert dict(kept_float32.named_modules())["model.layers.1.self_attn.o_proj"].weight.dtype == torch.float32


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_packs_its_own_rows_and_a_row_parallel_layer_keeps_whole_rows(tiny_gguf, rank):
    """Column-parallel layers keep this rank's rows; a row-parallel one (down_proj) keeps this rank's output
    rows over every input column too, so each rank computes whole outputs as tp=1 does."""
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    whole = loader.load_model(str(path), dtype="float32", quantization="gguf")
    with simulated_tp(rank, 2):
        shard = loader.load_model(str(path), dtype="float32", quantization="gguf")
    full_qkv = _packed(whole, "model.layers.1.self_attn.qkv_proj")
    q, k, v = full_qkv[:64], full_qkv[64:96], full_qkv[96:]
    expected_qkv = torch.cat([q[32 * rank:32 * (rank + 1)], k[16 * rank:16 * (rank + 1)],
                              v[16 * rank:16 * (rank + 1)]])
    assert torch.equal(_packed(shard, "model.layers.1.self_attn.qkv_proj"), expected_qkv)
    down = _packed(whole, "model.layers.0.mlp.down_proj")
    assert torch.equal(_packed(shard, "model.layers.0.mlp.down_proj"), down[32 * rank:32 * (rank + 1)])


@pytest.mark.needs_plugins
def test_a_non_gguf_checkpoint_is_refused_by_name(tmp_path):
    pytest.importorskip("loader_plugin_safetensors", reason="reading the non-GGUF checkpoint needs its format plugin")
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    folder = tmp_path / "hf"
    build_model("llama", tiny_config("llama")).save_pretrained(folder)
    with pytest.raises(UnsupportedError, match="does not come from a GGUF file"):
        loader.load_model(str(folder), dtype="float32", quantization="gguf")


def _segment_weights(model: torch.nn.Module, name: str) -> list[tuple[int, str, torch.Tensor]]:
    """Each segment of the fused layer ``name``: its first output row, kernel and the float32 weight it holds."""
    layer = dict(model.named_modules())[name]
    method = layer.quant_method
    assert isinstance(method, GGUFLinearMethod)
    out = []
    for segment in method.segments(layer):
        weight = segment.weight
        if isinstance(weight, torch.Tensor):
            dense = weight.to(torch.float32)
        else:
            dense = weight.matmul(torch.eye(weight.in_features)).t()  # float32: the weight itself, exactly
        out.append((segment.start, segment.kernel, dense))
    return out


def test_a_fused_layer_whose_parts_need_different_kernels_keeps_each_run_of_parts_on_its_own(tmp_path):
    """gate Q4_1 beside up Q8_0: two packed segments (int4, int4x2); q/k Q4_1 beside an F16 v: q and k stay
    packed, only v is dense. Each segment holds what a layer of its parts alone would, and the layer's output
    is the segments' outputs side by side."""
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    path = write_gguf(tmp_path / "mixed.gguf", model, "llama", qtype=Q.Q4_1,
                      quantized_as={"blk.0.ffn_up.weight": Q.Q8_0, "blk.1.attn_v.weight": Q.F16})
    uniform = write_gguf(tmp_path / "uniform.gguf", model, "llama", qtype=Q.Q4_1)
    packed, report = loader.load_model_with_report(str(path), quantization="gguf")
    layers = report.quantization["layers"]
    gate_up = layers["model.layers.0.mlp.gate_up_proj"]
    static = {"by_tokens": {"float32": dict.fromkeys(("1", "2-16", "17-64", "65-256", "257+"), "packed-bf16")},
              "paths_from": "static"}  # each packed segment planned as a layer (tests: the static rule)
    assert gate_up == {"kernel": "int4+int4x2", "types": ("Q4_1", "Q8_0"), "reason": None, "dtype": None,
                       "packed_bytes": int4_packed_bytes(128, 64, torch.bfloat16)
                       + int4_packed_bytes(2 * 128, 64, torch.bfloat16), **static}
    qkv = layers["model.layers.1.self_attn.qkv_proj"]
    assert qkv == {"kernel": "int4+dequantized", "types": ("Q4_1", "Q4_1", "F16"),
                   "reason": "part 'v': ggml type F16 has no packed int4 kernel", "dtype": "float32",
                   "packed_bytes": int4_packed_bytes(96, 64, torch.bfloat16), **static}
    assert report.quantization["kernels"] == {"int4": 6, "int4+int4x2": 1, "int4+dequantized": 1, "blocks": 1,
                                              "blocks+int4": 1}
    whole = loader.load_model(str(uniform), quantization="gguf")  # every part Q4_1: one int4 weight a layer
    dense = dict(loader.load_model(str(path), dtype="float32").named_parameters())
    (gate_at, gate_kernel, gate), (up_at, up_kernel, up) = _segment_weights(packed, "model.layers.0.mlp.gate_up_proj")
    assert (gate_at, gate_kernel, up_at, up_kernel) == (0, "int4", 128, "int4x2")
    assert torch.equal(gate, _packed(whole, "model.layers.0.mlp.gate_up_proj")[:128])
    # Q8_0 through the planes: each code times bf16(d), within bfloat16's rounding of d of the dequantized weight
    up_dense = dense["model.layers.0.mlp.gate_up_proj.weight"][128:]
    assert not torch.equal(up, up_dense) and bool(((up - up_dense).abs() <= 2**-8 * up_dense.abs()).all())
    (qk_at, qk_kernel, qk), (v_at, v_kernel, v) = _segment_weights(packed, "model.layers.1.self_attn.qkv_proj")
    assert (qk_at, qk_kernel, v_at, v_kernel) == (0, "int4", 96, "dequantized")
    assert torch.equal(qk, _packed(whole, "model.layers.1.self_attn.qkv_proj")[:96])
    assert v.dtype == torch.float32 and torch.equal(v, dense["model.layers.1.self_attn.qkv_proj.weight"][96:])
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    for name in ("model.layers.0.mlp.gate_up_proj", "model.layers.1.self_attn.qkv_proj"):
        layer = dict(packed.named_modules())[name]
        with torch.no_grad():
            got = layer(x)
        expected = torch.cat([torch.nn.functional.linear(x if kernel == "dequantized" else x.bfloat16().float(), w)
                              for _, kernel, w in _segment_weights(packed, name)], dim=-1)
        assert got.dtype == torch.float32 and got.shape == (3, expected.shape[-1])
        assert relative_error(got, expected) <= 1e-2, name
    ids = torch.arange(12).view(1, 12)
    with torch.no_grad():
        logits, reference = packed(ids), loader.load_model(str(path), dtype="float32")(ids)
    assert relative_error(logits, reference) <= 3e-2


def test_each_packed_segment_runs_the_path_its_timings_choose_per_input_size(tmp_path, monkeypatch):
    """A segmented layer's packed runs are planned like whole layers: with timings in which the dequantized twin
    wins at large inputs, a 300-token call dequantizes every packed segment and a 1-token call runs the kernels;
    the record joins the segments' paths per bucket."""
    from loader.kernels import TOKEN_BUCKETS, kernel_timing, weight_paths
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_timing, "_memory", {})
    fixed_cost = {b: {"packed-bf16": 1e-4 * b, "dequantize": 5e-3, "dense": 1e-5 * b} for b in TOKEN_BUCKETS}
    monkeypatch.setattr(kernel_timing, "measure_paths", lambda *args, **kwargs: fixed_cost)
    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    path = write_gguf(tmp_path / "mixed.gguf", model, "llama", qtype=Q.Q4_1,
                      quantized_as={"blk.0.ffn_up.weight": Q.Q8_0})
    packed, report = loader.load_model_with_report(str(path), quantization="gguf")
    record = report.quantization["layers"]["model.layers.0.mlp.gate_up_proj"]
    assert record["kernel"] == "int4+int4x2" and record["paths_from"] == "measured"
    assert record["by_tokens"] == {"float32": {"1": "packed-bf16", "2-16": "packed-bf16", "17-64": "packed-bf16",
                                               "65-256": "dequantize", "257+": "dequantize"}}
    layer = dict(packed.named_modules())["model.layers.0.mlp.gate_up_proj"]
    ran: list[str] = []
    real_run_path = weight_paths.run_path
    monkeypatch.setattr(weight_paths, "run_path", lambda w, p, x, d=None: ran.append(p) or real_run_path(w, p, x, d))
    with torch.no_grad():
        for tokens in (1, 300):
            x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
            expected = torch.cat([torch.nn.functional.linear(x.bfloat16().float(), w)
                                  for _, _, w in _segment_weights(packed, "model.layers.0.mlp.gate_up_proj")], -1)
            assert relative_error(layer(x), expected) <= 1e-2
    assert ran == ["packed-bf16", "packed-bf16", "dequantize", "dequantize"]


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_keeps_its_own_rows_of_every_segment(tiny_gguf, rank):
    """tp=2: a segmented layer's runs narrow to this rank's rows of each part, on the kernels tp=1 chose."""
    mixed = {"blk.0.attn_v.weight": Q.F16, "blk.1.ffn_up.weight": Q.Q8_0}
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None, quantized_as=mixed)
    whole = loader.load_model(str(path), quantization="gguf")
    with simulated_tp(rank, 2):
        shard, report = loader.load_model_with_report(str(path), quantization="gguf")
        plan = plan_layers(str(path))["layers"]
    assert plan == report.quantization["layers"]
    assert report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]["kernel"] == "int4+dequantized"
    assert report.quantization["layers"]["model.layers.1.mlp.gate_up_proj"]["kernel"] == "int4+int4x2"
    for name, parts in (("model.layers.0.self_attn.qkv_proj", ((0, 64), (64, 32), (96, 32))),
                        ("model.layers.1.mlp.gate_up_proj", ((0, 128), (128, 128)))):
        full = torch.cat([w for _, _, w in _segment_weights(whole, name)])
        mine = torch.cat([full[start + rank * size // 2:start + (rank + 1) * size // 2] for start, size in parts])
        got = _segment_weights(shard, name)
        assert [kernel for _, kernel, _ in got] == [kernel for _, kernel, _ in _segment_weights(whole, name)]
        assert torch.equal(torch.cat([w for _, _, w in got]), mine), name


def test_a_fused_layer_whose_parts_all_fall_back_is_one_dense_weight_and_a_refused_run_joins_it(tmp_path):
    """Parts that all need dequantizing stay one dense weight (no segments); a run of packable parts the kernel
    refuses (output features not a multiple of 16) is dequantized beside them, with the kernel's reason."""
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    every = {f"blk.0.attn_{part}.weight": Q.F16 for part in "qkv"}
    path = write_gguf(tmp_path / "f16.gguf", model, "llama", qtype=Q.Q4_1, quantized_as=every)
    loaded, report = loader.load_model_with_report(str(path), quantization="gguf")
    qkv = report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]
    assert qkv["kernel"] == "dequantized" and qkv["reason"] == "part 'q': ggml type F16 has no packed int4 kernel"
    layer = dict(loaded.named_modules())["model.layers.0.self_attn.qkv_proj"]
    assert layer.quant_method.segments(layer) == [] and layer.weight.shape == (128, 64)
    # eight heads of 8, one KV head: q and k are 64 + 8 rows, which the kernel refuses; v is F16
    narrow = tiny_config("llama", vocab_size=288, rope_scaling=None, num_attention_heads=8, num_key_value_heads=1)
    path = write_gguf(tmp_path / "q_k_72.gguf", build_model("llama", narrow), "llama", qtype=Q.Q4_1,
                      quantized_as={"blk.0.attn_v.weight": Q.F16})
    loaded, report = loader.load_model_with_report(str(path), quantization="gguf")
    qkv = report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]
    assert qkv == {"kernel": "dequantized", "types": ("Q4_1", "Q4_1", "F16"), "packed_bytes": 0,
                   "reason": "parts 'q', 'k': output features 72 are not a multiple of 16; part 'v': ggml type "
                             "F16 has no packed int4 kernel", "dtype": "float32"}
    layer = dict(loaded.named_modules())["model.layers.0.self_attn.qkv_proj"]
    assert layer.quant_method.segments(layer) == [] and layer.weight.shape == (80, 64)


def test_bad_input_is_the_same_named_error_with_the_packed_path(tmp_path):
    from loader.errors import CheckpointFormatError
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "model.gguf", build_model("llama", tiny_config("llama", vocab_size=288)), "llama",
                      qtype=Q.Q4_1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointFormatError, match=r"model\.gguf: tensor '.+' data runs past the end of the file"):
        loader.load_model(str(path), quantization="gguf")


def _kernel_weight(fields, dtype: torch.dtype) -> torch.Tensor:
    """The float32 ``[N, K]`` weight torch's kernel computes from ``fields`` with scales in ``dtype``."""
    from loader.kernels import pack_int4

    weight = pack_int4(fields.codes, fields.scales, fields.biases, 32, dtype)
    assert weight.packed, weight.reason
    return weight.matmul(torch.eye(weight.in_features, dtype=dtype)).t().float()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_every_packed_type_through_the_kernel_equals_gguf_py_with_float32_scales(tmp_path, qtype):
    """The decomposition is exact: the kernel with float32 scales gives gguf-py's values bit for bit.

    Wherever the kernel's zero ``z = bias + 8 s`` is exact in float32 — every group of Q4_0/Q4_1, and
    Q4_K's unless ``dmin m`` and ``8 d sc`` are many binades apart (0.3 % of these random groups) — and
    within that one rounding of ``z`` elsewhere.
    """
    from tests.helpers.gguf_files import random_blocks

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 64, 512
    if qtype == Q.Q4_K:  # gguf-py has no K-quant quantizer: random but valid super-blocks
        raw = random_blocks(qtype, rows * cols // block, seed=3).reshape(rows, cols // block * size)
    else:
        values = np.random.default_rng(3).normal(0.0, 0.05, (rows, cols)).astype(np.float32)
        raw = gguf.quants.quantize(values, qtype)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    fields = decode_q4(torch.from_numpy(raw), int(qtype))
    zero = fields.biases + 8 * fields.scales
    exact = (zero.double() == fields.biases.double() + 8 * fields.scales.double()).t().repeat_interleave(32, 1)
    assert bool(exact.all()) or qtype == Q.Q4_K
    assert exact.float().mean() > 0.99
    got = _kernel_weight(fields, torch.float32)
    assert torch.equal(got[exact], expected[exact])
    ulp = torch.finfo(torch.float32).eps * zero.abs().t().repeat_interleave(32, 1)
    assert bool(((got - expected).abs() <= ulp + torch.finfo(torch.float32).eps * expected.abs()).all())
    rounded = _kernel_weight(fields, torch.bfloat16)  # what runs: scales and zeros rounded to bfloat16
    s = fields.scales.t().repeat_interleave(32, 1)
    z = (fields.biases + 8 * fields.scales).t().repeat_interleave(32, 1)
    manual = ((fields.codes.float() - 8) * s.bfloat16().float() + z.bfloat16().float()).bfloat16().float()
    assert torch.equal(rounded, manual)
    assert bool(((rounded - expected).abs() <= 2**-7 * (8 * s.abs() + z.abs()) + expected.abs() * 2**-8).all())


def test_q4_k_layers_stay_packed_and_agree_with_the_dequantized_model(tiny_gguf):
    path, model = tiny_gguf("llama", Q.Q4_K, rope_scaling=None, hidden_size=256, intermediate_size=512)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    packed, report = loader.load_model_with_report(str(path))
    assert report.dtype == "float32"
    assert report.quantization["kernels"] == {"int4": 8, "blocks": 1, "blocks+int4": 1}  # + the own head
    assert set(report.quantization["layers"]["model.layers.0.mlp.down_proj"]) >= {"kernel", "reason",
                                                                                 "packed_bytes"}
    with torch.no_grad():
        got, expected = packed(ids), loader.load_model(str(path), dtype="float32")(ids)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.98
    assert relative_error(got, expected) <= 3e-2


@pytest.mark.parametrize(("kwargs", "packed", "dtype"), [
    ({}, True, "float32"),
    ({"dtype": "auto"}, True, "float32"),
    ({"dtype": "bfloat16"}, True, "bfloat16"),
    ({"dtype": "float32"}, False, "float32"),
    ({"format_options": {"dequantize": "true"}}, False, "float32"),
    ({"dtype": "bfloat16", "format_options": {"dequantize": True}}, False, "bfloat16"),
], ids=["default", "auto", "bfloat16", "float32", "dequantize-option", "bfloat16-dequantize"])
def test_the_default_keeps_gguf_packed_and_float32_or_the_option_dequantizes(tiny_gguf, kwargs, packed, dtype):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    model, report = loader.load_model_with_report(str(path), **kwargs)
    assert report.dtype == dtype
    assert (report.quantization is not None) == packed
    if packed:
        assert report.quantization["kernels"] == {"int4": 8, "blocks": 1, "blocks+int4": 1}  # + the own head
        assert report.quantization["kernel_dtype"] == "bfloat16"
    assert model.model.norm.weight.dtype == getattr(torch, dtype)


def test_a_dequantize_option_that_is_not_yes_or_no_is_refused_by_name(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    with pytest.raises(UnsupportedError, match=r"format option dequantize='maybe' is not a yes/no value"):
        loader.load_model(str(path), format_options={"dequantize": "maybe"})


def _retype(path, name: str, new_type: Q) -> None:
    """Rewrite the ggml type id of tensor ``name`` in the header (the data stays as written)."""
    import struct

    data = bytearray(path.read_bytes())
    at = data.index(name.encode()) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, int(new_type))
    path.write_bytes(bytes(data))


def test_a_declared_block_type_whose_data_size_disagrees_is_a_named_error_on_the_default_load(tmp_path):
    from loader.errors import CheckpointFormatError
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "model.gguf", build_model("llama", tiny_config("llama", vocab_size=288,
                                                                                  rope_scaling=None)),
                      "llama", qtype=Q.Q4_1)
    _retype(path, "blk.0.ffn_down.weight", Q.Q8_0)  # 34 bytes per 32 values where 20 were written
    with pytest.raises(CheckpointFormatError, match=r"model\.gguf: tensor '.+' starts at data offset \d+, so it "
                                                    r"overlaps tensor 'blk\.0\.ffn_down\.weight'"):
        loader.load_model(str(path))


def test_a_row_length_that_is_not_whole_blocks_is_a_named_error_on_the_default_load(tmp_path):
    from loader.errors import CheckpointFormatError
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "model.gguf", build_model("llama", tiny_config("llama", vocab_size=288,
                                                                                  rope_scaling=None)),
                      "llama", qtype=Q.Q4_1)
    _retype(path, "blk.0.ffn_down.weight", Q.Q4_K)  # rows of 128 values: not whole 256-value super-blocks
    with pytest.raises(CheckpointFormatError, match=r"rows of 128 values, not a multiple of the Q4_K block size 256"):
        loader.load_model(str(path))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_q4_k_row_parallel_layer_at_tp2_keeps_whole_super_blocks_of_its_rows(tiny_gguf, rank):
    """hidden 256 at tp=2: o_proj and down_proj keep 128 output rows each over every 256-value super-block."""
    path, _ = tiny_gguf("llama", Q.Q4_K, rope_scaling=None, hidden_size=256, intermediate_size=512)
    whole = loader.load_model(str(path))
    with simulated_tp(rank, 2):
        shard, report = loader.load_model_with_report(str(path))
    assert report.quantization["kernels"] == {"int4": 8, "blocks": 1, "blocks+int4": 1}  # + the own head
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj"):
        full = _packed(whole, name)
        assert torch.equal(_packed(shard, name), full[128 * rank:128 * (rank + 1)])


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_K])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_row_parallel_layer_whose_rank_rows_the_kernel_refuses_keeps_its_columns_packed(tmp_path, qtype, rank):
    """down_proj of 80 rows: 40 a rank is no multiple of 16, so each rank keeps half the input columns packed
    instead (Q4_K: 128 of 256, half of each super-block, whose 32-value groups are kept)."""
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    config = tiny_config("llama", vocab_size=288, hidden_size=80, intermediate_size=256, rope_scaling=None)
    path = write_gguf(tmp_path / "narrow.gguf", build_model("llama", config), "llama", qtype=Q.F16,
                      quantized_as={"blk.0.ffn_down.weight": qtype})
    whole = loader.load_model(str(path))
    with simulated_tp(rank, 2):
        shard, report = loader.load_model_with_report(str(path))
    assert report.quantization["layers"]["model.layers.0.mlp.down_proj"]["kernel"] == "int4"
    full = _packed(whole, "model.layers.0.mlp.down_proj")
    assert torch.equal(_packed(shard, "model.layers.0.mlp.down_proj"), full[:, 128 * rank:128 * (rank + 1)])


@pytest.mark.needs_plugins
def test_the_default_packed_load_through_the_transformers_fallback_equals_the_native_class(tiny_gguf):
    pytest.importorskip("loader_plugin_transformers", reason="the fallback is another plugin")
    path, model = tiny_gguf("llama", Q.Q4_1, rope_scaling=None)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    forced, report = loader.load_model_with_report(str(path), model_impl="transformers")
    assert report.model_impl == "transformers"
    assert report.quantization["kernels"] == {"int4": 14}  # q, k, v, o, gate, up, down unfused, 2 layers
    native = loader.load_model(str(path))
    # the fallback keeps transformers' dense head; give the native class the same one to compare every linear
    native.lm_head = loader.load_model(str(path), dtype="float32").lm_head
    with torch.no_grad():
        assert torch.equal(forced(ids), native(ids))


def test_a_layer_plan_of_a_gguf_file_is_the_default_load_s_method_not_dense(tmp_path):
    """``loader inspect --layers`` resolves the dtype and options as a load does: a default GGUF plan is the packed
    method's (planned from the header's block types, see ``test_layer_plan.py``), never the dense kernel the load
    would not use."""
    from loader._pipeline.plan import plan_layers
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "model.gguf", build_model("llama", tiny_config("llama", vocab_size=288)), "llama",
                      qtype=Q.Q4_1)
    plan = plan_layers(str(path))
    assert plan["quantization"] is not None and plan["quantization"]["method"] == "gguf"
    linears = {name: record for name, record in plan["layers"].items() if "layers." in name}
    assert linears and all(record["kernel"] == "int4" for record in linears.values()), linears
    dense = plan_layers(str(path), dtype="float32")
    assert dense["quantization"] is None
    assert {record["kernel"] for name, record in dense["layers"].items() if "layers." in name} == {"dense"}


@pytest.mark.parametrize(("size", "count"), [(18, 1), (20, 2)], ids=["Q4_0", "Q4_1"])
def test_block_fields_read_as_words_or_copied_out_of_unaligned_bytes_are_the_same(size, count):
    """The d (and m) of every block, group-major: read as one 2/4-byte word where the blocks are aligned, copied
    out first where they are not (a window starting at an odd byte) — the same float16 values either way."""
    from loader_plugin_gguf.packed.q4_blocks import _group_major_fields

    generator = torch.Generator().manual_seed(size)
    rows, groups = 6, 3
    halves = torch.rand(rows, groups, count, generator=generator).to(torch.float16)
    blocks = torch.randint(0, 256, (rows, groups, size), dtype=torch.uint8, generator=generator)
    blocks[..., :2 * count] = halves.view(torch.uint8).view(rows, groups, 2 * count)
    aligned = _group_major_fields(blocks, count)
    storage = torch.empty(blocks.numel() + 1, dtype=torch.uint8)
    storage[1:] = blocks.reshape(-1)
    unaligned = storage[1:].view(rows, groups, size)  # storage offset 1: no word view
    assert unaligned.storage_offset() == 1
    expected = halves.permute(1, 0, 2)
    assert torch.equal(aligned, expected) and torch.equal(_group_major_fields(unaligned, count), expected)


def test_the_packed_weight_follows_its_layer_s_buffers_when_they_are_replaced(tiny_gguf):
    """The wrapper over a layer's packed buffers is built once, and again when ``module.to`` replaces a buffer."""
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None)
    model = loader.load_model(str(path))
    layer = model.model.layers[0].mlp.down_proj
    method = layer.quant_method
    x = torch.randn(2, layer.input_size, generator=torch.Generator().manual_seed(0))
    first = method.int4_weight(layer)
    assert first is method.int4_weight(layer)
    expected = layer(x)
    layer.to(torch.float32)  # the bfloat16 scales and zeros become a new float32 buffer
    rebuilt = method.int4_weight(layer)
    assert rebuilt is not first and rebuilt.scales_and_zeros is layer.packed_scales_and_zeros
    assert rebuilt.scales_and_zeros.dtype == torch.float32
    assert relative_error(layer(x), expected) <= 1e-2  # the kernel now computes in float32, not bfloat16


def test_a_segmented_layer_follows_its_buffers_when_they_are_replaced(tiny_gguf):
    """A segmented layer's wrappers are built once, and again when ``module.to`` replaces a segment's buffer."""
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None, quantized_as={"blk.1.ffn_up.weight": Q.Q8_0})
    model = loader.load_model(str(path))
    layer = model.model.layers[1].mlp.gate_up_proj
    method = layer.quant_method
    x = torch.randn(2, layer.input_size, generator=torch.Generator().manual_seed(0))
    first = method.segments(layer)
    assert [s.kernel for s in first] == ["int4", "int4x2"]
    assert all(a.weight is b.weight for a, b in zip(first, method.segments(layer), strict=True))
    expected = layer(x)
    layer.to(torch.float32)  # every segment's bfloat16 scales and zeros become new float32 buffers
    rebuilt = method.segments(layer)
    assert rebuilt[0].weight.scales_and_zeros is layer.segment0_packed_scales_and_zeros
    assert rebuilt[1].weight.planes.scales_and_zeros is layer.segment1_packed_scales_and_zeros
    assert rebuilt[1].weight.kernel_dtype == torch.float32
    assert relative_error(layer(x), expected) <= 1e-2  # the kernel now computes in float32, not bfloat16



def test_the_load_report_says_what_packed_the_int4_layers(tiny_gguf, packing):
    """``quantization["packing"]``: ``compiled`` with the helpers, ``torch: <why>`` without them."""
    path, _ = tiny_gguf("llama", Q.Q4_1)
    _, report = loader.load_model_with_report(str(path))
    assert report.quantization["kernels"].get("int4")
    expected = "compiled" if packing == "native" else "torch: LOADER_NATIVE_REPACK=0"
    assert report.quantization["packing"] == expected


def test_a_load_with_nothing_packed_reports_no_packing(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q5_0)
    _, report = loader.load_model_with_report(str(path))
    assert "int4" not in "".join(report.quantization["kernels"]) and report.quantization["packing"] is None


def test_layers_packed_on_two_threads_are_byte_for_byte_the_one_thread_load(tiny_gguf, monkeypatch):
    """GGUF layers are post-processed concurrently on a CPU load; the buffers and the report do not change."""
    path, _ = tiny_gguf("llama", Q.Q4_1)
    loads = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("LOADER_READ_THREADS", threads)
        loads[threads] = loader.load_model_with_report(str(path))
    (one, one_report), (two, two_report) = loads["1"], loads["2"]
    assert one_report.quantization == two_report.quantization
    assert list(one_report.quantization["kernels"]) == list(two_report.quantization["kernels"])  # same order
    one_state, two_state = one.state_dict(), two.state_dict()
    assert one_state.keys() == two_state.keys()
    for name, tensor in one_state.items():
        assert torch.equal(tensor, two_state[name]), name
