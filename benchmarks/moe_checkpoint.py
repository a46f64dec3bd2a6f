"""The MoE benchmark's checkpoint: a Qwen3-MoE-shaped random model written by ``transformers`` itself.

``transformers`` writes per-expert tensors (``mlp.experts.E.gate_proj.weight``) while its modules hold fused
3-D experts, so the file layout is exactly what a Hub checkpoint has. The shape is a scaled-down
Qwen3-30B-A3B (32 experts of 384, 4 chosen per token, q/k norms, GQA 16/4; SmolLM2's 49152-token vocabulary,
so its GGUF twin carries a tokenizer llama.cpp accepts) sized to about 1.3 GB in bf16;
the router weights are random (``transformers`` starts them at zero, where every expert would tie). Cached
under ``benchmarks/out/`` with a marker naming the shape, as the Llama benchmark checkpoints are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["MOE_SHAPE", "ensure_moe_checkpoint", "moe_config"]

MOE_SHAPE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 49152,
    "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "num_experts": 32, "num_experts_per_tok": 4,
    "moe_intermediate_size": 384, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}


def moe_config(**overrides: Any) -> Any:
    """The ``transformers`` config of the benchmark shape (``overrides`` for the tiny warm-up twin)."""
    from transformers import Qwen3MoeConfig

    fields = {k: v for k, v in {**MOE_SHAPE, **overrides}.items() if k not in ("architectures", "model_type")}
    return Qwen3MoeConfig(**fields, architectures=["Qwen3MoeForCausalLM"])


def ensure_moe_checkpoint(folder: Path, **overrides: Any) -> Path:
    """Write the checkpoint into ``folder`` unless a complete one of the same shape is there."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    marker = folder / ".complete"
    spec = json.dumps({**MOE_SHAPE, **overrides}, sort_keys=True)
    if marker.is_file() and marker.read_text() == spec:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(moe_config(**overrides)).to(torch.bfloat16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder, max_shard_size="300MB")
    marker.write_text(spec)
    return folder
