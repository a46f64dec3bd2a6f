"""Mixture-of-experts GGUFs made by llama.cpp's own converter load with the source checkpoint's logits.

Each tiny ``transformers`` model (the ``mixtral``, ``qwen2_moe`` and ``qwen3_moe`` presets, SmolLM2's
vocabulary so the converter knows the tokenizer) is converted by ``convert_hf_to_gguf.py`` from the
``llama-cpp-python`` sdist (:mod:`tests.helpers.llamacpp_converter`; fetched from PyPI once, cached under
``.cache/llamacpp``; skipped with the reason when the registry cannot be reached).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader_plugin_gguf.format.header import read_header
from tests.helpers.gguf_moe_files import write_moe_gguf
from tests.helpers.hf_checkpoints import build_model, reference_logits, relative_error, tiny_config
from tests.helpers.llamacpp_converter import SMOLLM2_VOCAB, ConverterUnavailable, convert

pytestmark = pytest.mark.slow

F32_TOLERANCE = 1e-4
QUANTIZATION_MARGIN = 2.0
"""A Q8_0 MoE file may be off its source by at most this many times its dense twin's Q8_0 error (both
relative logit errors against their own source model, same sizes, same seed)."""
MOE_OVERRIDES = {"qwen2_moe": {"mlp_only_layers": []}}  # llama.cpp's qwen2moe has no dense layers


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``converted(family, outtype, **overrides) -> (gguf path, source model)``, cached per module."""
    cache: dict[tuple[Any, ...], tuple[Path, Any]] = {}

    def make(family: str, outtype: str, **overrides: Any) -> tuple[Path, Any]:
        key = (family, outtype, tuple(sorted(overrides.items())))
        if key not in cache:
            config = tiny_config(family, vocab_size=SMOLLM2_VOCAB, tie_word_embeddings=True,
                                 **{**MOE_OVERRIDES.get(family, {}), **overrides})
            model = build_model(family, config)
            try:
                path = convert(model, tmp_path_factory.mktemp(family), outtype)
            except ConverterUnavailable as exc:
                pytest.skip(str(exc))
            cache[key] = (path, model)
        return cache[key]

    return make


def _logits_error(path: Path, model: Any, **load: Any) -> float:
    torch.manual_seed(0)
    ids = torch.randint(0, SMOLLM2_VOCAB, (2, 11))
    with torch.no_grad():
        got = loader.load_model(str(path), **load)(ids)
    return relative_error(got.float(), reference_logits(model, ids))


@pytest.mark.parametrize("family", [
    pytest.param("mixtral", marks=pytest.mark.needs_plugins),  # MixtralForCausalLM is the mistral plugin's
    "qwen2_moe",
    "qwen3_moe",
])
def test_f32_files_give_the_source_checkpoints_logits(converted, family):
    path, model = converted(family, "f32")
    assert _logits_error(path, model, dtype="float32") <= F32_TOLERANCE


def test_q8_0_qwen3_moe_is_within_its_dense_twins_quantization_error(converted):
    """The dense twin: Qwen3 of the same sizes whose MLP is as wide as the experts a token runs (top_k x the
    expert width); both converted to Q8_0 by llama.cpp, both compared with their own source model, loaded
    dequantized (float32) and packed (dtype auto: the experts on the int4 kernel as two planes)."""
    moe_path, moe = converted("qwen3_moe", "q8_0")
    inter = moe.config.moe_intermediate_size * moe.config.num_experts_per_tok
    dense_path, dense = converted("qwen3", "q8_0", intermediate_size=inter)
    for load in ({"dtype": "float32"}, {"format_options": {"packed_cache": False}}):
        moe_error = _logits_error(moe_path, moe, **load)
        dense_error = _logits_error(dense_path, dense, **load)
        assert 0 < moe_error <= QUANTIZATION_MARGIN * dense_error, (load, moe_error, dense_error)


def test_q8_0_experts_stay_packed_with_dtype_auto(converted):
    path, _ = converted("qwen3_moe", "q8_0")
    _, report = loader.load_model_with_report(str(path), format_options={"packed_cache": False})
    layers = report.quantization["layers"]
    for layer in range(2):
        for part in ("w13", "w2"):
            record = layers[f"model.layers.{layer}.mlp.experts.{part}"]
            assert record["kernel"] == "int4x2" and record["reason"] is None and record["packed_bytes"] > 0


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_the_test_writer_lays_files_out_as_the_converter_does(converted, family, tmp_path):
    """tests.helpers.gguf_moe_files writes what the converter cannot (Q4 experts, damaged files): its tensor
    names, shapes and MoE metadata must be the converter's."""
    path, model = converted(family, "f32")
    ours = write_moe_gguf(tmp_path / "ours.gguf", model, family)
    theirs_header, ours_header = read_header(path), read_header(ours)
    assert {t.name: t.shape for t in ours_header.tensors} == {t.name: t.shape for t in theirs_header.tensors}
    arch = theirs_header.architecture
    assert ours_header.architecture == arch
    keys = [k for k in theirs_header.metadata if k.startswith(f"{arch}.expert")]
    assert keys and {k: ours_header.metadata.get(k) for k in keys} == {k: theirs_header.metadata[k] for k in keys}
