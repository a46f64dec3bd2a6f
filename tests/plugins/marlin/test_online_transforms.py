"""compressed-tensors online rotations: a Hadamard matrix multiplies each targeted layer's input in the forward.

The checkpoint is packed by the tests' pack-quantized packer with ``down_proj``'s weight rotated offline
(``W @ H / sqrt(n)``, what a ``weight_input`` rotation stores) and the matrix ``H`` stored once, as
llm-compressor stores SpinQuant's R4 (``model.layers.0.mlp.down_proj.R4_input.weight``, float64). The
reference is the ``transformers`` model whose ``down_proj`` holds the dequantized rotated weight rotated back,
so a load that forgets the online rotation is far from it. (llm-compressor's own QuIP and SpinQuant checkpoints
are checked in ``test_llmcompressor.py``.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import CheckpointFormatError, UnsupportedError
from loader_plugin_marlin.compressed_tensors_config import ct_config_from_checkpoint
from tests.helpers.compressed_tensors_checkpoints import ct_quantization_config, pack_compressed_tensors
from tests.helpers.gptq_checkpoints import input_seed, save_packed_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error, tiny_config
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_cases import run_quantized_cases


def hadamard(size: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix (entries ±1), ``size`` a power of two."""
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


def _r4(head_dim: int | None = None, **change: Any) -> dict[str, Any]:
    scheme = {"type": "hadamard", "head_dim": head_dim, "randomize": False, "precision": "torch.float64",
              "apply": [{"location": "input", "targets": [r"re:.*down_proj$"], "inverse": False, "ignore": []},
                        {"location": "weight_input", "targets": [r"re:.*down_proj$"], "inverse": True,
                         "ignore": []}]}
    return {"config_groups": {"R4": {**scheme, **change}}}


def _save(path: Path, head_dim: int | None = None, drop_matrix: bool = False) -> tuple[Path, Any]:
    size = head_dim or tiny_config("llama").intermediate_size
    rotation = torch.block_diag(*[hadamard(size)] * (tiny_config("llama").intermediate_size // size))
    scaled = (rotation / math.sqrt(size)).float()

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if module.endswith("down_proj"):
            weight = weight @ scaled  # the weight_input rotation, fused into what is stored
        return pack_compressed_tensors(weight, 4, 32, sym=True, actorder=False, seed=input_seed(module))

    declared = {**ct_quantization_config(4, 32, sym=True, actorder=False), "transform_config": _r4(head_dim)}
    path, reference = save_packed_checkpoint("llama", path, declared, pack)
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.mlp.down_proj.weight.copy_(layer.mlp.down_proj.weight @ scaled.t())
    if not drop_matrix:
        tensors = load_file(path / "model.safetensors")
        tensors["model.layers.0.mlp.down_proj.R4_input.weight"] = hadamard(size)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path, reference


def _error(model: Any, reference: Any) -> float:
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        return relative_error(model(ids), reference_logits(reference, ids))


@pytest.mark.parametrize("head_dim", [None, 32])
def test_the_rotation_of_down_proj_inputs_is_applied_in_the_forward(tmp_path, head_dim) -> None:
    path, reference = _save(tmp_path, head_dim)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert report.quantization["online_rotations"] == {"groups": ["R4"], "layers": reference.config.num_hidden_layers}
    unrotated, _ = loader.load_model_with_report(str(path), dtype="float32")
    for layer in unrotated.model.layers:
        layer.mlp.down_proj._forward_pre_hooks.clear()
    assert _error(unrotated, reference) > 0.01  # the comparison sees a missing rotation


def test_a_rotation_without_its_stored_matrix_is_named(tmp_path) -> None:
    path, _ = _save(tmp_path, drop_matrix=True)
    with pytest.raises(CheckpointFormatError, match=r"transform_config: model.layers.0.mlp.down_proj is rotated by "
                                                    r"'R4', but the checkpoint has no R4_input.weight of size 128"):
        loader.load_model(str(path), dtype="float32")


@pytest.mark.parametrize(("change", "message"), [
    ({"type": "matrix-multiply"}, r"transform type 'matrix-multiply' is not supported; expected one of "
                                  r"\['hadamard', 'random-hadamard'\]"),
    ({"randomize": True}, r"randomize \(permuted Hadamard rows\) is not supported"),
    ({"apply": [{"location": "q_attn", "targets": ["re:.*q_proj$"]}]},
     r"an online rotation at location 'q_attn' is not supported; only 'input'"),
    ({"apply": [{"location": "output", "targets": ["Linear"]}]},
     r"an online rotation at location 'output' is not supported"),
])
def test_rotations_that_are_not_supported_are_named(change, message) -> None:
    declared = {**ct_quantization_config(4, 32, sym=True, actorder=False), "transform_config": _r4(**change)}
    with pytest.raises(UnsupportedError, match=rf"transform_config.config_groups.R4: {message}"):
        ct_config_from_checkpoint(declared)


@pytest.mark.torchrun
def test_a_rotation_of_a_row_parallel_layer_s_whole_input_at_tp2(tmp_path) -> None:
    """R4 spans ``down_proj``'s whole input, which tp=2 splits: each rank gathers it, rotates and keeps its half."""
    path, reference = _save(tmp_path / "ckpt")
    out, ranks = run_quantized_cases({"r4": {"path": str(path), "options": None}}, tmp_path)
    expected = reference_logits(reference, random_ids(reference.config.vocab_size))
    for rank in range(2):
        assert ranks[rank]["r4"]["tp_size"] == 2
        assert relative_error(torch.load(out / f"r4-rank{rank}.pt"), expected) <= 1e-3
