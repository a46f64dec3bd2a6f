"""Where greedy decode spends its time: torch.profiler over ``generate_greedy`` on SmolLM2, grouped by layer kind.

Loads SmolLM2-135M-Instruct Q4_1 (``scripts/fetch_smollm2.py``) the way ``--quantization``/``--dtype`` say,
decodes once to warm up, then profiles the decode steps of a second generation (``--tokens`` tokens; the
prefill is excluded) and prints, per token: the whole step's wall time, the time inside the linear layers
(split into the packed int4 kernel, dense matmuls and the casts around them), attention (SDPA and the KV
cache), the embedding, norms, rotary, the LM head, and what is left (Python and small ops). The table says
which part a faster packed matmul can win and which it cannot.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/profile_generate.py [--quantization gguf]
[--dtype float32] [--tokens 32] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPT = "What is the capital of France?"

# Layer kinds, matched on the module class name that torch.profiler's record_function gets below.
_KINDS = ("QKVParallelLinear", "MergedColumnParallelLinear", "RowParallelLinear", "Attention", "RotaryEmbedding",
          "RMSNorm", "SiluAndMul", "VocabParallelEmbedding", "ParallelLMHead")


def _instrument(model):  # type: ignore[no-untyped-def]
    """Wrap each interesting module's forward in a profiler range named after its class."""
    import torch

    for module in model.modules():
        kind = type(module).__name__
        if kind not in _KINDS:
            continue
        forward = module.forward

        def timed(*args, _forward=forward, _kind=kind, **kwargs):  # type: ignore[no-untyped-def]
            with torch.profiler.record_function(f"layer::{_kind}"):
                return _forward(*args, **kwargs)

        module.forward = timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import loader
    from loader._generation import encode_prompt, greedy_tokens, tokenizer_for

    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    torch.set_num_threads(args.threads)
    path = str(fetch_smollm2())
    model = loader.load_model(path, dtype=args.dtype, quantization=args.quantization)
    bundle = tokenizer_for(path)
    prompt_ids = encode_prompt(bundle, PROMPT, chat=True)
    list(greedy_tokens(model, prompt_ids, args.tokens))  # warm-up: first-call allocations and rope tables
    _instrument(model)

    steps = greedy_tokens(model, prompt_ids, args.tokens)
    next(steps)  # the prefill, outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        decoded = sum(1 for _ in steps)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    per_token = 1e3 / decoded
    self_ms: dict[str, float] = defaultdict(float)
    for event in events:
        self_ms[event.key] += event.self_cpu_time_total / 1e3
    layer_ms = {e.key: e.cpu_time_total / 1e3 for e in events if e.key.startswith("layer::")}
    print(f"{args.quantization or 'dequantized'} dtype={args.dtype} threads={torch.get_num_threads()}: "
          f"{decoded} decode steps, {wall / decoded * 1e3:.2f} ms/token ({decoded / wall:.1f} tok/s)")
    print("\ninclusive time per token by layer kind (ms):")
    for key, ms in sorted(layer_ms.items(), key=lambda kv: -kv[1]):
        print(f"  {key[7:]:28s} {ms * per_token / 1e3:7.3f}")
    inside = sum(layer_ms.values())
    # Everything outside the instrumented layers: the decoder's residual adds, views, argmax, Python.
    print(f"  {'(outside those layers)':28s} {(wall * 1e3 - inside) * per_token / 1e3:7.3f}")
    print("\ntop ops by self time per token (ms):")
    for key, ms in sorted(self_ms.items(), key=lambda kv: -kv[1])[:15]:
        if not key.startswith("layer::"):
            print(f"  {key:44s} {ms * per_token / 1e3:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
