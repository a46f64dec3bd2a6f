"""Live weight updates on checkpoints written by ``transformers``: load A, update with B, equal to a fresh B.

Every family (dense, tied, mixture-of-experts) at tp=1 and, in one ``torchrun`` launch, at tp=2 (with a GPTQ
model given B's packed tensors); the parameters keep their storage; A's files are untouched although its
parameters were mapped from them; ``reload_weights`` from B's folder and from B's sharded state equals a fresh
load of B.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import loader
from loader._mapped_parameters import is_file_backed
from loader._sharded.save import save_sharded
from loader.errors import ConfigError, MissingWeightsError, ShapeMismatchError
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.hf_checkpoints import build_model, save_checkpoint, tiny_config
from tests.helpers.model_checks import random_ids

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ["llama", "qwen2", "mistral", "mixtral", "qwen3_moe"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("updates")
    pairs = {}
    for family in FAMILIES:
        save_checkpoint(family, root / family / "A", seed=0)
        save_checkpoint(family, root / family / "B", seed=1)
        pairs[family] = (root / family / "A", root / family / "B")
    return pairs


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))  # type: ignore[no-any-return]


def _pointers(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in model.named_parameters()}


def _digests(folder: Path) -> dict[str, str]:
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in sorted(folder.iterdir())}


@pytest.mark.parametrize("family", FAMILIES)
def test_an_update_with_b_equals_a_fresh_load_of_b(checkpoints, family, monkeypatch) -> None:
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")  # the tiny tensors are mapped from A's files
    a, b = checkpoints[family]
    files_before = _digests(a)
    model = loader.load_model(str(a), dtype="float32")
    if sys.platform.startswith("linux"):
        assert any(is_file_backed(p) for p in model.parameters())
    pointers = _pointers(model)
    trained = build_model(family, tiny_config(family), seed=1)  # B as transformers holds it
    report = loader.update_weights(model, trained.state_dict())
    assert torch.equal(_logits(model), _logits(loader.load_model(str(b), dtype="float32")))
    assert _pointers(model) == pointers
    assert _digests(a) == files_before
    assert report.version == loader.weights_version(model) == 1
    assert set(report.parameters) == {name for name, _ in model.named_parameters()}


def test_a_bfloat16_model_takes_float32_tensors(checkpoints) -> None:
    a, b = checkpoints["llama"]
    model = loader.load_model(str(a), dtype="bfloat16")
    loader.update_weights(model, build_model("llama", seed=1).state_dict())
    assert torch.equal(_logits(model), _logits(loader.load_model(str(b), dtype="bfloat16")))


def test_a_partial_update_of_one_fused_part_changes_only_its_rows(checkpoints) -> None:
    a, _ = checkpoints["llama"]
    model = loader.load_model(str(a), dtype="float32")
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    before = qkv.detach().clone()
    report = loader.update_weights(model, {"model.layers.0.self_attn.k_proj.weight": torch.ones(32, 64)})
    assert report.parameters == ("model.layers.0.self_attn.qkv_proj.weight",)
    assert bool((qkv[64:96] == 1).all())
    assert torch.equal(qkv[:64], before[:64]) and torch.equal(qkv[96:], before[96:])


def test_a_wrong_shape_names_the_tensor_and_changes_nothing(checkpoints) -> None:
    a, _ = checkpoints["qwen2"]
    model = loader.load_model(str(a), dtype="float32")
    expected = _logits(model)
    state = build_model("qwen2", seed=1).state_dict()
    state["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 96)
    with pytest.raises(ShapeMismatchError, match=r"tensor 'model.layers.1.mlp.down_proj.weight' of the update: "
                                                 r"expected shape \(64, 128\) for model.layers.1.mlp.down_proj, "
                                                 r"found \(64, 96\); nothing was written"):
        loader.update_weights(model, state)
    assert torch.equal(_logits(model), expected)
    assert loader.weights_version(model) == 0


def test_reload_from_b_and_back_from_a(checkpoints) -> None:
    a, b = checkpoints["mixtral"]
    model = loader.load_model(str(a), dtype="float32")
    pointers = _pointers(model)
    report = loader.reload_weights(model, str(b))
    assert torch.equal(_logits(model), _logits(loader.load_model(str(b), dtype="float32")))
    assert report.version == 1
    loader.reload_weights(model)  # where it was loaded from: A
    assert torch.equal(_logits(model), _logits(loader.load_model(str(a), dtype="float32")))
    assert _pointers(model) == pointers
    assert loader.weights_version(model) == 2


def test_reload_from_b_sharded_state(checkpoints, tmp_path) -> None:
    _, b = checkpoints["llama"]
    save_sharded(str(b), tmp_path / "b-tp1", tp_size=1, dtype="float32")
    model = loader.load_model(str(tmp_path / "b-tp1"), dtype="float32")
    pointers = _pointers(model)
    loader.update_weights(model, build_model("llama", seed=0).state_dict())  # now A
    loader.reload_weights(model)  # back to B, by name
    assert torch.equal(_logits(model), _logits(loader.load_model(str(b), dtype="float32")))
    assert _pointers(model) == pointers


def test_reload_from_another_model_is_refused_before_any_write(checkpoints) -> None:
    a, _ = checkpoints["llama"]
    other, _ = checkpoints["qwen2"]
    model = loader.load_model(str(a), dtype="float32")
    with pytest.raises(ConfigError, match=r"architectures is \['Qwen2ForCausalLM'\] where the loaded model has "
                                          r"\['LlamaForCausalLM'\]; reload_weights fills the same model again"):
        loader.reload_weights(model, str(other))
    assert loader.weights_version(model) == 0


def test_reload_from_a_checkpoint_missing_a_tensor_says_so(checkpoints, tmp_path) -> None:
    a, _ = checkpoints["llama"]
    model = loader.load_model(str(a), dtype="float32")
    state = {k: v.contiguous() for k, v in build_model("llama", seed=1).state_dict().items()
             if k != "model.norm.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((a / "config.json").read_text())
    with pytest.raises(MissingWeightsError, match=r"has no weights for parameter\(s\) model.norm.weight; the reload "
                                                  r"wrote \d+ tensor\(s\), and the weights version stays 0"):
        loader.reload_weights(model, str(tmp_path))


@pytest.mark.torchrun
def test_tensor_parallel_updates_equal_fresh_loads(checkpoints, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    gptq_a, _ = save_gptq_checkpoint("llama", tmp_path / "gptq-A", group_size=32, desc_act=True, seed=0)
    gptq_b, _ = save_gptq_checkpoint("llama", tmp_path / "gptq-B", group_size=32, desc_act=True, seed=1)
    cases = [f"{a}::{b}" for a, b in [*checkpoints.values(), (gptq_a, gptq_b)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).parent / "scripts" / "tp_update.py"), str(out), *cases]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        results = json.loads((out / f"rank{rank}.json").read_text())
        for case in cases:
            assert results[case] == {"equal": True, "version": 1, "storage_kept": True, "tp_size": 2}, case


def test_the_docs_example_runs(checkpoints) -> None:
    a, b = checkpoints["qwen2"]
    done = subprocess.run([sys.executable, str(REPO / "docs" / "examples" / "update_weights.py"), str(a), str(b)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "storage kept: True" in done.stdout
    assert "equal to a fresh load of B: True" in done.stdout
