"""The MoE benchmark's checkpoint as a Q4_0 GGUF (``qwen3moe``), for loader's packed experts against llama.cpp.

Written with gguf-py from the safetensors checkpoint of :mod:`benchmarks.moe_checkpoint`, tensor for tensor
under the names and metadata llama.cpp's converter gives a Qwen3-MoE (``blk.N.ffn_{gate,up,down}_exps`` 3-D,
experts outermost; ``ffn_gate_inp`` the router; q/k norms), every matrix quantized to Q4_0 by
``gguf.quants.quantize`` (the converter writes no Q4_0, and ``llama-quantize`` is not in the Python
package), norms and router float32, and SmolLM2's tokenizer fields (the checkpoint's vocabulary is SmolLM2's
49152 tokens so llama.cpp accepts the file). Cached beside the checkpoint with a marker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gguf_checkpoints import _tokenizer_fields
from benchmarks.moe_checkpoint import MOE_SHAPE

__all__ = ["ensure_moe_gguf"]

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
_EXPERT_PARTS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                 "down_proj": "ffn_down_exps.weight"}


def _metadata(writer: Any, shape: dict[str, Any]) -> None:
    writer.add_name("random Qwen3-MoE benchmark Q4_0")
    writer.add_context_length(shape["max_position_embeddings"])
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(shape["num_attention_heads"])
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    writer.add_expert_count(shape["num_experts"])
    writer.add_expert_used_count(shape["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(shape["moe_intermediate_size"])


def _gguf_name(name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "lm_head.weight":
        return "output.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    layer, _, rest = name.removeprefix("model.layers.").partition(".")
    return f"blk.{layer}.{_LAYER_NAMES[rest]}" if rest in _LAYER_NAMES else None


def ensure_moe_gguf(folder: Path, smollm2: Path) -> Path:
    """``folder``'s checkpoint as ``moe-q4_0.gguf`` in ``folder``, written unless a complete one is there."""
    import gguf
    from safetensors import safe_open

    path = folder / "moe-q4_0.gguf"
    marker = folder / ".gguf-complete"
    spec = json.dumps(MOE_SHAPE, sort_keys=True)
    if path.is_file() and marker.is_file() and marker.read_text() == spec:
        return path
    writer = gguf.GGUFWriter(path, "qwen3moe")
    _metadata(writer, MOE_SHAPE)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    for key, value, kind in _tokenizer_fields(smollm2):
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                values = handle.get_tensor(name).float().numpy()
                if ".mlp.experts." in name:
                    layer, _, rest = name.removeprefix("model.layers.").partition(".mlp.experts.")
                    expert, part, _ = rest.split(".")
                    experts.setdefault((int(layer), part), {})[int(expert)] = values
                    continue
                target = _gguf_name(name)
                if target is None:
                    raise ValueError(f"no GGUF name for {name}")
                _add(writer, gguf, target, values)
    for (layer, part), by_expert in sorted(experts.items()):
        stacked = np.stack([by_expert[e] for e in range(len(by_expert))])
        _add(writer, gguf, f"blk.{layer}.{_EXPERT_PARTS[part]}", stacked)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    marker.write_text(spec)
    return path


def _add(writer: Any, gguf: Any, name: str, values: np.ndarray) -> None:
    """Norms and the router stay float32; every other matrix becomes Q4_0."""
    if values.ndim == 1 or name.endswith("ffn_gate_inp.weight"):
        writer.add_tensor(name, values.astype(np.float32))
        return
    kind = gguf.GGMLQuantizationType.Q4_0
    writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
