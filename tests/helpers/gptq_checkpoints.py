"""The GPTQ format reference the marlin plugin's tests rely on: a packer written from the format's definition.

Kept independent of the plugin (its own loops over bit positions, its own
dequantization) so the tests check the plugin rather than echo it. What it
writes, for one linear weight ``W [N, K]`` (``nn.Linear`` orientation):

* ``g_idx`` int32 ``[K]``: the group of each input row. Without act-order
  ``k // group_size``; with act-order the rows are visited in a permutation
  ``perm`` and ``g_idx[perm[i]] = i // group_size``, as GPTQ does. A partial
  last group (``K % group_size != 0``) holds the remaining rows.
* per group and output column, round to nearest over the group's rows:
  ``maxq = 2**bits - 1``; ``lo = min(w.min(), 0)``, ``hi = max(w.max(), 0)``;
  symmetric: ``hi = max(-lo, hi)``, ``lo = -hi``, ``zero = 2**(bits-1)``;
  asymmetric: ``zero = round(-lo / scale)``; ``scale = (hi - lo) / maxq``
  rounded to float16; ``code = clamp(round(w / scale) + zero, 0, maxq)``.
* ``qweight`` int32 ``[K / p, N]`` (``p = 32 / bits``): code of row
  ``p*r + j`` in bits ``[bits*j, bits*(j+1))`` of word ``r``;
  ``qzeros`` int32 ``[G, N / p]``: zero of column ``p*c + j`` in word ``c``,
  stored minus one (``& maxq``, so a zero of 0 wraps) for ``checkpoint_format``
  ``gptq`` and as it is for ``gptq_v2``; ``scales`` float16 ``[G, N]``.
* the weight is ``(code - zero) * scale`` for the row's group (:func:`dequantize`).

GPTQModel 7.6 writes this layout (``DESIGN.md``: qzeros 0x77777777 for
symmetric 4-bit v1, scales F16 ``[groups, out]``, ``g_idx`` I32 ``[in]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from tests.helpers.hf_checkpoints import build_model, tiny_config

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@attrs.frozen
class Quantized:
    """One weight quantized by :func:`quantize`: codes ``[K, N]``, scales/zeros ``[G, N]``, ``g_idx [K]``."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int


def make_g_idx(k: int, group_size: int, act_order: bool, seed: int = 0) -> torch.Tensor:
    """The group of each input row (shuffled by a random permutation with act-order)."""
    size = k if group_size == -1 else group_size
    order = torch.arange(k)
    if act_order:
        order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // size).to(torch.int32)
    return g_idx


def quantize(weight: torch.Tensor, bits: int, group_size: int, *, sym: bool, act_order: bool = False,
             seed: int = 0) -> Quantized:
    """Round-to-nearest GPTQ quantization of ``weight [N, K]`` (see the module docstring)."""
    n, k = weight.shape
    maxq = (1 << bits) - 1
    g_idx = make_g_idx(k, group_size, act_order, seed)
    groups = int(g_idx.max()) + 1
    w = weight.t().to(torch.float32)  # [K, N]
    scales = torch.empty(groups, n, dtype=torch.float16)
    zeros = torch.empty(groups, n, dtype=torch.int32)
    for g in range(groups):
        rows = (g_idx == g).nonzero().flatten()
        block = w[rows]
        lo = torch.clamp(block.min(0).values, max=0)
        hi = torch.clamp(block.max(0).values, min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            lo = -hi
        scale = ((hi - lo) / maxq).clamp(min=1e-4).to(torch.float16)
        zero = torch.full((n,), (maxq + 1) // 2) if sym else torch.round(-lo / scale.float()).clamp(0, maxq)
        scales[g] = scale
        zeros[g] = zero.to(torch.int32)
    return quantize_with(weight, scales, zeros, g_idx, bits)


def quantize_with(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                  bits: int) -> Quantized:
    """The codes of ``weight [N, K]`` under given ``scales``/``zeros [G, N]`` and ``g_idx``:
    ``clamp(round(w / scale) + zero, 0, 2**bits - 1)`` (so a library's own scales can be packed here)."""
    maxq = (1 << bits) - 1
    g = g_idx.long()
    w = weight.t().to(torch.float32)
    codes = torch.clamp(torch.round(w / scales[g].float()) + zeros[g], 0, maxq).to(torch.int32)
    return Quantized(codes, scales, zeros.to(torch.int32), g_idx, bits)


def dequantize(q: Quantized) -> torch.Tensor:
    """``W [N, K] = (code - zero) * scale`` in float32, the row's group from ``g_idx``."""
    g = q.g_idx.long()
    return ((q.codes - q.zeros[g]).float() * q.scales[g].float()).t().contiguous()


def pack_words(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``values [..., M]`` (M a multiple of 32/bits) into int32 words along the last dim, low bits first."""
    pack = 32 // bits
    *lead, m = values.shape
    out = torch.zeros(*lead, m // pack, dtype=torch.int64)
    for j in range(pack):
        out |= (values[..., j::pack].to(torch.int64) & ((1 << bits) - 1)) << (bits * j)
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


def pack_gptq(q: Quantized, *, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """The four GPTQ tensors of one weight (names without the module prefix)."""
    zeros = q.zeros - 1 if checkpoint_format == "gptq" else q.zeros
    return {
        "qweight": pack_words(q.codes.t(), q.bits).t().contiguous(),
        "qzeros": pack_words(zeros, q.bits),
        "scales": q.scales.clone(),
        "g_idx": q.g_idx.clone(),
    }


def input_seed(module: str) -> int:
    """One act-order permutation per layer input: q/k/v share theirs, and so do gate/up (as in GPTQ)."""
    shared = module.replace("k_proj", "q_proj").replace("v_proj", "q_proj").replace("up_proj", "gate_proj")
    return sum(ord(c) * (i + 1) for i, c in enumerate(shared)) % 10_000


def gptq_quantization_config(bits: int, group_size: int, *, sym: bool, desc_act: bool,
                             checkpoint_format: str = "gptq", lm_head: bool = False) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
            "checkpoint_format": checkpoint_format, "lm_head": lm_head}


def save_gptq_checkpoint(
    family: str, path: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True, desc_act: bool = False,
    checkpoint_format: str = "gptq", seed: int = 0, lm_head: bool = False,
    dynamic: dict[str, dict[str, Any]] | None = None, **overrides: Any,
) -> tuple[Path, Any]:
    """Quantize a random ``family`` model's decoder linears into a GPTQ checkpoint at ``path``.

    ``lm_head``: quantize the (untied) output head too, declared as GPTQModel does (``lm_head: true``).
    ``dynamic``: GPTQModel's per-module rules (``{"lm_head": {"bits": 8, ...}}``; ``re.match`` on the module
    name, first match wins), applied when packing and written to the config.

    Returns ``(path, reference)``: ``reference`` is the ``transformers`` model
    whose linear weights are replaced by their dequantized values, the model
    whose logits a correct load reproduces.
    """
    quantization_config = gptq_quantization_config(bits, group_size, sym=sym, desc_act=desc_act,
                                                    checkpoint_format=checkpoint_format, lm_head=lm_head)

    if dynamic:
        quantization_config["dynamic"] = dynamic

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rule = next((rule for key, rule in (dynamic or {}).items() if re.match(key.removeprefix("+:"), module)), {})
        q = quantize(weight, rule.get("bits", bits), rule.get("group_size", group_size), sym=rule.get("sym", sym),
                     act_order=rule.get("desc_act", desc_act), seed=input_seed(module))
        return pack_gptq(q, checkpoint_format=checkpoint_format), dequantize(q)

    return save_packed_checkpoint(family, path, quantization_config, pack, seed=seed,
                                  packed_modules=(*LINEARS, "lm_head") if lm_head else LINEARS, **overrides)


Packer = Callable[[torch.Tensor, str], tuple[dict[str, torch.Tensor], torch.Tensor]]
"""``(weight [N, K], module name) -> ({tensor suffix: tensor}, dequantized weight)`` for one linear weight."""


def save_packed_checkpoint(family: str, path: Path, quantization_config: dict[str, Any], pack: Packer, *,
                           keep_dense: tuple[str, ...] = (), seed: int = 0, packed_modules: tuple[str, ...] = LINEARS,
                           **overrides: Any) -> tuple[Path, Any]:
    """Write a random ``family`` model with its decoder linears packed by ``pack``; return it with the reference.

    The reference is the ``transformers`` model whose packed linears hold
    their dequantized weights. ``keep_dense``: module names (e.g.
    ``model.layers.0.self_attn.q_proj``) stored as float weights. ``packed_modules``: the
    module names (last component) to pack; ``lm_head`` may be among them.
    """
    from safetensors.torch import save_file

    config = tiny_config(family, **overrides)
    model = build_model(family, config, seed=seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.rpartition(".")[2] in packed_modules and module not in keep_dense:
            packed, dequantized = pack(param, module)
            for key, value in packed.items():
                tensors[f"{module}.{key}"] = value
            with torch.no_grad():
                param.copy_(dequantized)
        elif not (name == "lm_head.weight" and config.tie_word_embeddings):
            tensors[name] = param.detach().clone().contiguous()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config_dict = config.to_dict()
    config_dict["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config_dict, indent=2))
    return path, model
