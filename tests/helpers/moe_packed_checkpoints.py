"""Tiny mixture-of-experts checkpoints with GPTQ or compressed-tensors experts, written by the project's packers.

``transformers`` holds a MoE model's experts fused in 3-D parameters but
writes them one tensor per expert part (``mlp.experts.7.gate_proj.weight``,
Mixtral's ``block_sparse_moe.experts.7.w1.weight``), and GPTQModel and
llm-compressor quantize each such part as its own linear layer, writing
``experts.7.gate_proj.qweight`` / ``...weight_packed``. So the model is first
saved by ``transformers`` (its names), then every decoder linear — attention,
dense and shared-expert MLPs, each expert's parts — is replaced by the packer's
tensors (:mod:`tests.helpers.gptq_checkpoints`,
:mod:`tests.helpers.compressed_tensors_checkpoints`); routers
(``mlp.gate``, ``shared_expert_gate``) and the head stay dense, as both tools
keep them. The reference is ``transformers``' own load (its expert fusion) of
the same checkpoint with each packed weight replaced by its dequantized value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.helpers.compressed_tensors_checkpoints import ct_quantization_config, pack_compressed_tensors
from tests.helpers.gptq_checkpoints import dequantize, gptq_quantization_config, input_seed, pack_gptq, quantize
from tests.helpers.hf_checkpoints import build_model, tiny_config

EXPERT_PART = re.compile(r"\.experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)$")
DENSE_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROUTERS_IGNORED = ["re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]
"""llm-compressor's MoE examples keep the routers dense with ``ignore`` patterns like these."""

MoePacker = Callable[[torch.Tensor, int], tuple[dict[str, torch.Tensor], torch.Tensor]]
"""``(weight [N, K], act-order seed) -> ({tensor suffix: tensor}, dequantized weight)``."""


def shared_input_seed(module: str) -> int:
    """One act-order permutation per layer input: gate and up of an expert share theirs (Mixtral's w1/w3 too)."""
    return input_seed(re.sub(r"\.w3$", ".w1", module))


def is_packed(module: str) -> bool:
    """Whether the tools quantize ``module``: every decoder linear and expert part, never a router or head."""
    return bool(EXPERT_PART.search(module)) or module.rpartition(".")[2] in DENSE_LINEARS


def save_moe_packed_checkpoint(family: str, path: Path, quantization_config: dict[str, Any], pack: MoePacker, *,
                               seed: int = 0, **overrides: Any) -> tuple[Path, Any]:
    """Write ``family`` (a MoE preset) with its linears and experts packed by ``pack`` at ``path``; return it with
    ``transformers``' float32 model of the dequantized weights (saved beside it, ``<path>-dequantized``)."""
    from safetensors.torch import load_file, save_file

    model = build_model(family, tiny_config(family, **overrides), seed=seed)
    dense = path.parent / f"{path.name}-dequantized"
    model.save_pretrained(dense)
    packed: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(dense / "model.safetensors").items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and is_packed(module):
            parts, dequantized[name] = pack(tensor, shared_input_seed(module))
            packed.update({f"{module}.{key}": value for key, value in parts.items()})
        else:
            packed[name] = dequantized[name] = tensor.contiguous()
    path.mkdir(parents=True, exist_ok=True)
    save_file(packed, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dense / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}, indent=2))
    return path, transformers_model_of(dense, config, dequantized)


def transformers_model_of(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """``transformers``' float32 model of a checkpoint of ``tensors`` named as on disk (per expert), written to
    ``folder`` with ``config`` and loaded by ``from_pretrained``, which fuses the experts its own way."""
    import transformers
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        old.unlink()
    config = {key: value for key, value in config.items() if key != "quantization_config"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: t.to(torch.float32).contiguous() for name, t in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def save_gptq_moe_checkpoint(family: str, path: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True,
                             desc_act: bool = False, checkpoint_format: str = "gptq", seed: int = 0,
                             **overrides: Any) -> tuple[Path, Any]:
    """A GPTQ MoE checkpoint as GPTQModel lays it out (per-expert ``qweight``/``qzeros``/``scales``/``g_idx``)."""
    def pack(weight: torch.Tensor, order_seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        q = quantize(weight, bits, group_size, sym=sym, act_order=desc_act, seed=order_seed)
        return pack_gptq(q, checkpoint_format=checkpoint_format), dequantize(q)

    config = gptq_quantization_config(bits, group_size, sym=sym, desc_act=desc_act,
                                      checkpoint_format=checkpoint_format)
    return save_moe_packed_checkpoint(family, path, config, pack, seed=seed, **overrides)


def save_ct_moe_checkpoint(family: str, path: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True,
                           actorder: bool = False, seed: int = 0, **overrides: Any) -> tuple[Path, Any]:
    """A compressed-tensors ``pack-quantized`` MoE checkpoint as llm-compressor lays it out (W4A16 / W8A16),
    routers in ``ignore``."""
    def pack(weight: torch.Tensor, order_seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return pack_compressed_tensors(weight, bits, group_size, sym=sym, actorder=actorder, seed=order_seed)

    config = ct_quantization_config(bits, group_size, sym=sym, actorder=actorder, ignore=ROUTERS_IGNORED)
    return save_moe_packed_checkpoint(family, path, config, pack, seed=seed, **overrides)
