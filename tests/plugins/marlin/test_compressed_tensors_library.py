"""compressed-tensors (the library llm-compressor saves through) against the packer and the loader.

Skipped where compressed-tensors is not installed (``pip install -c constraints.txt compressed-tensors``;
tox env ``marlin-compressed-tensors``). Two checks:

* the packer's ``pack-quantized`` bytes equal the library's ``PackedQuantizationCompressor.compress`` for
  the same float weight and the library's own scales and zero points (``calculate_qparams``), W4A16 and
  W8A16, symmetric and asymmetric, groups of 32 and 128 and per channel. From the float weight alone the
  two do not agree bit for bit: the packer rounds scales to float16 (GPTQ's convention), the library keeps
  the model's dtype, so codes at a rounding boundary differ; the scales are compared to float16 precision;
* checkpoints the library compressed and saved load, and their logits match a model built from the
  library's own ``decompress`` within 1e-3 relative (float32);
* FP8 (``float-quantized``): the library parses the FP8 packer's config groups, compresses to its bytes and
  decompresses to its weight, and its forward's input rounding equals the reference's and the loader's.

compressed-tensors 0.20.1 has no act-order ``g_idx`` any more (``actorder: "group"`` was removed), so
the ``weight_g_idx`` path is covered by the packer's own checkpoints only.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("compressed_tensors",
                    reason="compressed-tensors is not installed: tox -e marlin-compressed-tensors")

import loader
from loader_plugin_marlin.fp8_activations import emulated_input
from loader_plugin_marlin.fp8_config import fp8_scheme_from_ct
from tests.helpers.compressed_tensors_checkpoints import ct_tensors
from tests.helpers.ct_library_checkpoints import (
    ct_library_dequantized_weights,
    quantization_args,
    reference_from_ct_library,
    save_ct_library_checkpoint,
)
from tests.helpers.fp8_checkpoints import ct_fp8_group, fp8_tensors, input_rounding
from tests.helpers.gptq_checkpoints import make_g_idx, quantize, quantize_with
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.int8_checkpoints import (
    STATIC_INPUT_SCALE,
    STATIC_INPUT_ZERO_POINT,
    fake_quantize,
    fake_quantize_inputs,
    int8_host,
    int8_scheme,
    quantize_int8,
    save_int8_checkpoint,
)
from tests.helpers.model_checks import random_ids

GRID = [(bits, group_size, sym) for bits in (4, 8) for group_size in (32, 128, -1) for sym in (True, False)]


def _library_qparams(weight, args):
    from compressed_tensors.quantization.utils import calculate_qparams

    size = weight.shape[1] if args.group_size is None else args.group_size
    groups = weight.reshape(weight.shape[0], -1, size)
    return calculate_qparams(groups.amin(-1), groups.amax(-1), args)


@pytest.mark.parametrize(("bits", "group_size", "sym"), GRID)
def test_the_packer_writes_the_library_s_bytes(bits, group_size, sym):
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    n, k = 96, 256
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(bits * 1000 + group_size)) * 0.05
    args = quantization_args(bits, group_size, sym=sym)
    scale, zero = _library_qparams(weight, args)
    theirs = PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": scale, "weight_zero_point": zero},
        QuantizationScheme(targets=["Linear"], weights=args))

    # the library's zero point is signed (``code - 2**(bits-1)``); the packer's is the unsigned code
    q = quantize_with(weight, scale.t(), zero.to(torch.int32).t() + (1 << (bits - 1)), make_g_idx(k, group_size, False),
                      bits)
    mine = ct_tensors(q, sym=sym, scale_dtype=scale.dtype)
    assert sorted(mine) == sorted(theirs), (sorted(mine), sorted(theirs))
    for name, tensor in theirs.items():
        assert mine[name].dtype == tensor.dtype, name
        assert torch.equal(mine[name], tensor), f"{name} differs in {int((mine[name] != tensor).sum())} places"

    # from the float weight alone: same scale formula, the packer's rounded to float16
    own = quantize(weight, bits, group_size, sym=sym)
    torch.testing.assert_close(own.scales.float(), scale.t().to(torch.float16).float(), rtol=2 ** -10, atol=0)


CASES = {
    "llama-w4a16-sym-g32": ("llama", dict(bits=4, group_size=32, sym=True)),
    "llama-w4a16-asym-g64": ("llama", dict(bits=4, group_size=64, sym=False)),
    "qwen2-w4a16-asym-g128": ("qwen2", dict(bits=4, group_size=128, sym=False)),
    "llama-w8a16-sym-g32": ("llama", dict(bits=8, group_size=32, sym=True)),
    "qwen2-w8a16-asym-channel": ("qwen2", dict(bits=8, group_size=-1, sym=False)),
}
SIZES = dict(hidden_size=128, intermediate_size=256)


@pytest.mark.parametrize("case", list(CASES))
def test_library_written_checkpoints_load_as_its_own_decompression(case, tmp_path):
    family, fields = CASES[case]
    path = save_ct_library_checkpoint(family, tmp_path / case, **fields, **SIZES)
    weights = ct_library_dequantized_weights(path)
    assert len(weights) == 14  # seven linears in each of two layers; lm_head is in the config's ignore list
    reference = reference_from_ct_library(family, path, weights, **SIZES)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.quantization["groups"]["group_0"]["bits"] == fields["bits"]
    ids = random_ids(reference.config.vocab_size, seq=24)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    print(f"{case}: relative error {error:.3g} against compressed-tensors' decompression; "
          f"kernels {report.quantization['kernels']}")
    assert error <= 1e-3


# -- FP8 (float-quantized): the packer's tensors and the activation rounding against the library ---------------

FP8_LAYOUTS = ["ct-tensor-static", "ct-tensor-dynamic", "ct-channel-token", "ct-block-group"]


@pytest.mark.parametrize("layout", FP8_LAYOUTS)
def test_the_fp8_packer_writes_the_library_s_tensors(layout):
    """The library parses the packer's config group, compresses the same weight with the packer's scales into the
    same FP8 bytes (80 input columns: a partial last block of 32), and decompresses to the packer's weight."""
    from compressed_tensors.compressors import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    weight = torch.randn(96, 80, generator=torch.Generator().manual_seed(len(layout))) * 0.05
    ours, dequantized = fp8_tensors(weight, layout, (32, 32))
    scheme = QuantizationScheme.model_validate(ct_fp8_group(layout, (32, 32)))
    theirs = FloatQuantizationCompressor.compress({"weight": weight, "weight_scale": ours["weight_scale"]}, scheme)
    assert set(theirs) == set(ours)
    assert theirs["weight"].dtype == ours["weight"].dtype == torch.float8_e4m3fn
    assert torch.equal(theirs["weight"].view(torch.uint8), ours["weight"].view(torch.uint8))
    back = FloatQuantizationCompressor.decompress(theirs, scheme)
    assert torch.equal(back["weight"].to(torch.float32), dequantized)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["ct-tensor-dynamic", "ct-channel-token", "ct-block-group", "ct-tensor-static"])
def test_input_rounding_is_the_library_s_forward_quantize(layout, dtype):
    """What compressed-tensors' decompressed forward does to a linear's input, bit for bit: the reference's
    pre-hook and the loader's emulation (a model's scales are in its dtype)."""
    from compressed_tensors.quantization import QuantizationScheme, QuantizationStatus
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize

    scheme = QuantizationScheme.model_validate(ct_fp8_group(layout, (32, 32)))
    module = torch.nn.Linear(64, 8)
    module.quantization_status = QuantizationStatus.DECOMPRESSED
    static = torch.tensor([0.004], dtype=dtype)
    module.input_scale = torch.nn.Parameter(static.clone(), requires_grad=False)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(7)).to(dtype)
    x[1, 2] = 0.0  # a zero row: the scale's epsilon
    expected = forward_quantize(module, x, "input", scheme.input_activations)
    hook = input_rounding(layout, 32, static)
    assert torch.equal(hook(module, (x,))[0], expected)
    acts = fp8_scheme_from_ct("group_0", ct_fp8_group(layout, (32, 32))).scheme.activations
    assert torch.equal(emulated_input(x, acts, None if acts.dynamic else static, split_input=False), expected)


INT8_GRID = [(strategy, sym) for strategy in ("channel", "tensor", "group") for sym in (True, False)]


@pytest.mark.parametrize(("strategy", "sym"), INT8_GRID)
def test_the_int8_packer_writes_the_library_s_int_quantized_tensors(strategy, sym):
    """``int-quantized``: the packer's codes, scales and zero points are the library's ``calculate_qparams`` +
    ``IntQuantizationCompressor.compress``, and its dequantized weight the library's ``decompress``."""
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    weight = torch.randn(96, 128, generator=torch.Generator().manual_seed(len(strategy))) * 0.05
    tensors, dequantized = quantize_int8(weight, strategy, symmetric=sym, group_size=32)
    scheme = QuantizationScheme.model_validate(int8_scheme(strategy, symmetric=sym, group_size=32))
    blocks = {"tensor": weight.reshape(1, 1, -1), "channel": weight.reshape(96, 1, 128),
              "group": weight.reshape(96, 4, 32)}[strategy]
    scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights)
    shape = tensors["weight_scale"].shape
    state = {"weight": weight, "weight_scale": scale.reshape(shape)}
    if not sym:
        state["weight_zero_point"] = zero.reshape(shape).round().to(torch.int8)
    compressed = IntQuantizationCompressor.compress(state, scheme)
    assert torch.equal(compressed["weight"], tensors["weight"])
    assert torch.allclose(compressed["weight_scale"], tensors["weight_scale"], rtol=1e-6, atol=0)
    assert sym or torch.equal(compressed["weight_zero_point"], tensors["weight_zero_point"])
    decompressed = IntQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    assert torch.allclose(decompressed, dequantized, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("activations", [dict(dynamic=True, symmetric=True), dict(dynamic=True, symmetric=False),
                                         dict(dynamic=False, symmetric=True), dict(dynamic=False, symmetric=False)],
                         ids=["token", "token-asym", "static", "static-asym"])
def test_int8_input_fake_quantization_is_the_library_s_forward_quantize(activations):
    """The ``int8_mm`` reference's input rounding equals compressed-tensors' ``forward_quantize``."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStatus
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize

    args = QuantizationArgs(num_bits=8, type="int", symmetric=activations["symmetric"],
                            strategy="token" if activations["dynamic"] else "tensor", dynamic=activations["dynamic"])
    module = torch.nn.Linear(64, 8)
    module.quantization_status = QuantizationStatus.FROZEN
    module.input_scale = torch.nn.Parameter(torch.tensor([STATIC_INPUT_SCALE]), requires_grad=False)
    module.input_zero_point = torch.nn.Parameter(
        torch.tensor([0 if activations["symmetric"] else STATIC_INPUT_ZERO_POINT], dtype=torch.int8),
        requires_grad=False)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    expected = forward_quantize(module, x, "input", args)
    assert torch.allclose(fake_quantize(x, {"dynamic": activations["dynamic"], "symmetric": activations["symmetric"]}),
                          expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheme_args", [dict(strategy="channel"), dict(strategy="tensor", activations="tensor")],
                         ids=["w8a8-channel-token", "w8a8-tensor-static"])
def test_transformers_5_24_drops_int8_input_quantization_which_the_loader_keeps(tmp_path, scheme_args):
    """transformers 5.24's ``run_compressed=False`` (``dequantize=True``) load with compressed-tensors 0.20 gives
    the weight-only reference's logits: it no longer runs compressed-tensors' wrapped forward, so W8A8 inputs are
    not rounded. The checkpoint's producer (llm-compressor 0.14, and the transformers 5.17 it runs with:
    ``test_llmcompressor.py``) rounds them; the loader follows the producer and equals the input-rounded
    reference, measurably apart from this transformers' result."""
    import transformers

    scheme = int8_scheme(**scheme_args)
    path, reference = save_int8_checkpoint("llama", tmp_path / "m", scheme)
    config = transformers.CompressedTensorsConfig(run_compressed=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=config,
                                                               torch_dtype=torch.float32)
    ids = random_ids(reference.config.vocab_size)
    assert relative_error(reference_logits(theirs, ids), reference_logits(reference, ids)) <= 1e-5
    ours = loader.load_model(str(path), dtype="float32", quantization="int8-test", host=int8_host())
    rounded = reference_logits(fake_quantize_inputs(reference, scheme["input_activations"]), ids)
    with torch.no_grad():
        assert relative_error(ours(ids), rounded) <= 1e-5
        assert relative_error(ours(ids), reference_logits(theirs, ids)) > 1e-3
