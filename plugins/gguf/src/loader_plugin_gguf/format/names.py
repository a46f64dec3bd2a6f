"""GGUF tensor names -> Hugging Face names, through gguf-py's own tables.

gguf-py's ``TensorNameMap`` maps, for one GGUF architecture, every known source-checkpoint
spelling of a module (``model.layers.{bid}.self_attn.q_proj``, ``transformer.h.{bid}.attn``,
...) to its GGUF name (``blk.{bid}.attn_q``). That table is many-to-one, so it cannot be
reversed blindly; what we add is only the Hugging Face side: the module names our model
classes accept (:data:`HF_MODULES`, the ``LlamaForCausalLM`` family layout, and for
mixture-of-experts files :data:`EXPERT_MODULES`). Each is looked up in gguf-py's table for the
file's architecture, and the GGUF template it maps to is kept as the reverse entry. A GGUF name
that no accepted HF module maps to is refused by name.
"""

from __future__ import annotations

import functools
import re

import attrs
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES
from gguf.tensor_mapping import TensorNameMap

from loader.errors import UnexpectedWeightError, UnsupportedError

__all__ = ["EXPERT_MODULES", "HF_MODULES", "ROTARY_TABLES", "NameMapper", "name_mapper"]

HF_MODULES = (
    "model.embed_tokens",
    "model.norm",
    "lm_head",
    "model.layers.{bid}.input_layernorm",
    "model.layers.{bid}.self_attn.q_proj",
    "model.layers.{bid}.self_attn.k_proj",
    "model.layers.{bid}.self_attn.v_proj",
    "model.layers.{bid}.self_attn.o_proj",
    "model.layers.{bid}.self_attn.q_norm",
    "model.layers.{bid}.self_attn.k_norm",
    "model.layers.{bid}.post_attention_layernorm",
    "model.layers.{bid}.mlp.gate_proj",
    "model.layers.{bid}.mlp.up_proj",
    "model.layers.{bid}.mlp.down_proj",
)
"""Module names (without ``.weight``/``.bias``) of the Llama-shaped families our models load."""

_QWEN_EXPERTS = (
    "model.layers.{bid}.mlp.gate",
    "model.layers.{bid}.mlp.experts.gate_proj",
    "model.layers.{bid}.mlp.experts.up_proj",
    "model.layers.{bid}.mlp.experts.down_proj",
    "model.layers.{bid}.mlp.shared_expert.gate_proj",
    "model.layers.{bid}.mlp.shared_expert.up_proj",
    "model.layers.{bid}.mlp.shared_expert.down_proj",
    "model.layers.{bid}.mlp.shared_expert_gate",
)
EXPERT_MODULES: dict[str, tuple[str, ...]] = {
    # Mixtral's own checkpoint names (its model renames block_sparse_moe to mlp): experts w1/w2/w3
    "llama": (
        "model.layers.{bid}.block_sparse_moe.gate",
        "model.layers.{bid}.block_sparse_moe.experts.w1",
        "model.layers.{bid}.block_sparse_moe.experts.w3",
        "model.layers.{bid}.block_sparse_moe.experts.w2",
    ),
    "qwen2moe": _QWEN_EXPERTS,
    "qwen3moe": _QWEN_EXPERTS,
}
"""The router, the 3-D tensors of every expert (named without an expert index) and Qwen2-MoE's shared expert,
as each architecture's HF model names them; architectures without experts have none."""

ROTARY_TABLES = (MODEL_TENSOR.ROPE_FREQS, MODEL_TENSOR.ATTN_ROT_EMBD)
"""Precomputed rotary tables llama.cpp may store; the model computes its own (see config)."""

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


@attrs.frozen
class NameMapper:
    """Maps one architecture's GGUF tensor names to HF names."""

    arch: str
    block_count: int
    to_hf: dict[str, str]  # GGUF module template ("blk.{bid}.attn_q") -> HF module template
    skipped: frozenset[str]  # GGUF templates to skip (rotary tables)

    def is_skipped(self, gguf_name: str) -> bool:
        return _template(gguf_name)[0] in self.skipped

    def hf_name(self, gguf_name: str, file: str) -> str:
        """The HF name of ``gguf_name``; :class:`UnexpectedWeightError` for a tensor with no place."""
        template, bid, suffix = _template(gguf_name)
        hf = self.to_hf.get(template)
        if hf is None or (bid is not None and bid >= self.block_count):
            where = f"block {bid} of {self.block_count}" if bid is not None and hf is not None else None
            raise UnexpectedWeightError(
                f"tensor {gguf_name!r} in {file}: no {self.arch!r} model parameter corresponds to it"
                + (f" ({where})" if where else "")
            )
        return hf.format(bid=bid) + suffix


def _template(gguf_name: str) -> tuple[str, int | None, str]:
    """``blk.3.attn_q.weight`` -> (``blk.{bid}.attn_q``, 3, ``.weight``)."""
    stem, suffix = gguf_name, ""
    for end in (".weight", ".bias"):
        if gguf_name.endswith(end):
            stem, suffix = gguf_name[: -len(end)], end
            break
    match = _BLOCK.match(stem)
    if match is None:
        return stem, None, suffix
    return "blk.{bid}." + match.group(2), int(match.group(1)), suffix


def gguf_arch(arch: str) -> MODEL_ARCH:
    """gguf-py's enum member for a ``general.architecture`` string."""
    for member, name in MODEL_ARCH_NAMES.items():
        if name == arch:
            return member
    raise UnsupportedError(f"GGUF architecture {arch!r} is unknown to gguf-py")


@functools.lru_cache(maxsize=16)
def name_mapper(arch: str, block_count: int) -> NameMapper:
    """The mapper for ``arch``; built from a one-block ``TensorNameMap`` (cheap) and cached."""
    table = TensorNameMap(gguf_arch(arch), 1)
    to_hf: dict[str, str] = {}
    for hf in (*HF_MODULES, *EXPERT_MODULES.get(arch, ())):
        found = table.get_type_and_name(hf.format(bid=0))
        if found is None:
            continue  # the architecture has no such tensor (q_norm outside Qwen3)
        tensor, _ = found
        to_hf[TENSOR_NAMES[tensor]] = hf
    skipped = frozenset(TENSOR_NAMES[t] for t in ROTARY_TABLES)
    return NameMapper(arch=arch, block_count=block_count, to_hf=to_hf, skipped=skipped)
