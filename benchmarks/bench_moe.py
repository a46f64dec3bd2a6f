"""Mixture-of-experts: load and decode of a Qwen3-MoE-shaped 1.3 GB checkpoint, loader against transformers.

``python benchmarks/bench_moe.py [--reps 5] [--decode-reps 3] [--tokens 32]``:

- load: ``loader.load_model`` (native ``Qwen3MoeForCausalLM``, bf16), ``transformers.from_pretrained`` and the
  page-cache floor (every shard read into one pre-faulted buffer), each in a fresh process under the rules of
  ``run_all.py`` (warm page cache, one untimed warm-up each, order rotating, clock until every parameter page
  is touched, peak RSS as ``VmHWM``);
- decode: greedy steps through a KV cache after a 32-token prompt, on 2 threads, loader's forward against
  transformers' own on the same weights (bf16), each in a fresh process, alternating; tokens per second of
  the steps after the prompt.

- with ``--gguf``: the same weights as a Q4_0 GGUF (:mod:`benchmarks.moe_gguf`), loader's packed experts
  (``quantization="gguf"``, float32 activations) against llama.cpp (``llama-cpp-python`` built from source by
  ``benchmarks/llamacpp_venv.py``), through ``bench_gguf_packed.py``'s children: load, peak RSS, decode tok/s
  on ``--threads`` threads after SmolLM2's chat prompt.

The checkpoint is written by transformers (:mod:`benchmarks.moe_checkpoint`). The section goes to
``benchmarks/RESULTS.md`` between ``<!-- moe -->`` markers, which ``run_all.py`` carries over.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import shard_files
from benchmarks.moe_checkpoint import ensure_moe_checkpoint
from benchmarks.paths import PATHS
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT, child_env, measure_rotating

BENCH_DIR = Path(__file__).resolve().parent
LOAD_PATHS = ("loader", "transformers", "floor")
DECODERS = ("loader", "transformers")
TAG = "moe"
PROMPT = 32


def decode_child(which: str, folder: Path, tokens: int) -> dict[str, Any]:
    """In this (fresh) process: load ``folder`` with ``which``, prefill a prompt, time ``tokens`` greedy steps."""
    import torch

    torch.set_num_threads(2)
    ids = torch.randint(3, 30000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    if which == "loader":
        import loader
        from loader.layers import KVCache

        model = loader.load_model(str(folder), dtype="bfloat16")
        cache = KVCache(model.config.num_hidden_layers)

        def step(x: torch.Tensor) -> torch.Tensor:
            return model(x, cache=cache)[:, -1]  # type: ignore[no-any-return]
    else:
        from transformers import AutoModelForCausalLM, DynamicCache

        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
        past = DynamicCache()

        def step(x: torch.Tensor) -> torch.Tensor:
            return model(input_ids=x, past_key_values=past, use_cache=True).logits[:, -1]  # type: ignore[no-any-return]
    generated = []
    with torch.no_grad():
        start = time.perf_counter()
        logits = step(ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(tokens):
            token = logits.argmax(-1, keepdim=True)
            generated.append(int(token))
            logits = step(token)
        seconds = time.perf_counter() - start
    return {"which": which, "prefill_seconds": prefill, "decode_seconds": seconds, "tokens": tokens,
            "tokens_per_second": tokens / seconds, "generated": generated}


def measure_decode(folder: Path, reps: int, tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Each decoder ``reps`` times in fresh processes, alternating which goes first."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in DECODERS}
    env = {**child_env(), "OMP_NUM_THREADS": "2"}
    for rep in range(reps):
        order = DECODERS if rep % 2 == 0 else DECODERS[::-1]
        for which in order:
            done = subprocess.run([sys.executable, __file__, "--decode-child", which, str(folder), str(tokens)],
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
            if done.returncode:
                raise RuntimeError(f"decode child {which} failed: {done.stderr[-2000:]}")
            runs[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def _med(values: list[float]) -> float:
    return statistics.median(values)


def render(load: dict[str, dict[str, Any]], decode: dict[str, list[dict[str, Any]]], folder: Path,
           meta: dict[str, str]) -> str:
    """The Markdown section (without its markers)."""
    checkpoint = sum(f.stat().st_size for f in shard_files(folder))
    lines = ["## Mixture-of-experts (issue 29)", "", f"- Date: {meta['date']}", f"- Machine: {meta['machine']}",
             f"- Software: {meta['software']}", f"- Environment: {meta['environment']}",
             f"- Command: `{meta['command']}`", "",
             f"`{meta['checkpoint']}`: Qwen3-MoE shape written by transformers (12 layers, 32 experts of 384, 4 "
             f"per token), {checkpoint / 1e9:.2f} GB bf16. Load: {meta['reps']} repetitions per path, fresh "
             "process each, warm page cache, order rotating, clock until every parameter page is touched.", "",
             "| path | median s | s per GB | vs floor | peak RSS | peak / checkpoint bytes | status |",
             "|---|---:|---:|---:|---:|---:|---|"]
    floor = _med(load["floor"]["seconds"]) if load["floor"]["seconds"] else None
    for name in LOAD_PATHS:
        entry = load[name]
        status = "ok" if not entry["errors"] else f"{len(entry['errors'])} failed: {entry['errors'][0]}"
        if not entry["seconds"]:
            lines.append(f"| {entry['label']} | — | — | — | — | — | {status} |")
            continue
        med, peak = _med(entry["seconds"]), _med([float(v) for v in entry["peak_rss"]])
        ratio = f"{med / floor:.2f}x" if floor else "—"
        lines.append(f"| {entry['label']} | {med:.3f} | {med / (checkpoint / 1e9):.3f} | {ratio} | "
                     f"{peak / 2**20:,.0f} MiB | {peak / checkpoint:.2f} | {status} |")
    lines += ["", f"Decode: {PROMPT}-token prompt, then {decode['loader'][0]['tokens']} greedy steps through a KV "
              f"cache, 2 threads, bf16, {len(decode['loader'])} fresh processes per side, alternating.", "",
              "| forward | median tok/s | min-max tok/s | prefill s | same tokens as transformers |",
              "|---|---:|---:|---:|---|"]
    reference = decode["transformers"][0]["generated"]
    for which in DECODERS:
        rates = [r["tokens_per_second"] for r in decode[which]]
        same = all(r["generated"] == reference for r in decode[which])
        lines.append(f"| {which} | {_med(rates):.2f} | {min(rates):.2f}-{max(rates):.2f} | "
                     f"{_med([r['prefill_seconds'] for r in decode[which]]):.3f} | {'yes' if same else 'no'} |")
    ratio = _med([r["tokens_per_second"] for r in decode["loader"]]) / _med(
        [r["tokens_per_second"] for r in decode["transformers"]])
    lines += ["", f"loader decodes at {ratio:.2f}x transformers' tokens per second."]
    return "\n".join(lines) + "\n"


def measure_gguf(folder: Path, reps: int, tokens: int, threads: int) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """loader's packed experts and llama.cpp on the Q4_0 GGUF twin, ``reps`` fresh processes each, alternating."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    from benchmarks.bench_gguf_packed import LLAMA_CPP, QUESTION, run_once
    from benchmarks.llamacpp_venv import llamacpp_python
    from benchmarks.moe_gguf import ensure_moe_gguf
    from loader._generation import encode_prompt, tokenizer_for

    smollm2 = Path(fetch_smollm2())
    path = ensure_moe_gguf(folder, smollm2)
    prompt = encode_prompt(tokenizer_for(str(smollm2)), QUESTION, chat=True)
    llamacpp = llamacpp_python()
    path.read_bytes()  # page cache warm for both
    runs: dict[str, list[dict[str, Any]]] = {"packed": [], LLAMA_CPP: []}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            runs[name].append(run_once(name, path, prompt, tokens, threads, llamacpp))
    return path, runs


def render_gguf(path: Path, runs: dict[str, list[dict[str, Any]]], threads: int) -> str:
    """The GGUF part of the section."""
    lines = ["", f"Q4_0 GGUF of the same weights (`{path.name}`, {path.stat().st_size / 1e9:.2f} GB, written with "
             f"gguf-py), {len(runs['packed'])} fresh processes per side, alternating, {threads} threads, SmolLM2's "
             "chat prompt (the model is random: the text is not meant to read).", "",
             "| path | load s | peak RSS | prefill s | decode tok/s |", "|---|---:|---:|---:|---:|"]
    for name, records in runs.items():
        label = "loader, experts packed (int4)" if name == "packed" else name
        lines.append(f"| {label} | {_med([r['load_s'] for r in records]):.3f} | "
                     f"{_med([r['peak_rss'] for r in records]) / 2**20:,.0f} MiB | "
                     f"{_med([r['prefill_s'] for r in records]):.3f} | "
                     f"{_med([r['decode_tok_s'] for r in records]):.2f} |")
    ratio = _med([r["decode_tok_s"] for r in runs["packed"]]) / _med(
        [r["decode_tok_s"] for r in list(runs.values())[1]])
    lines += ["", f"loader's packed experts decode at {ratio:.2f}x llama.cpp's tokens per second."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list and args_list[0] == "--decode-child":
        print(json.dumps(decode_child(args_list[1], Path(args_list[2]), int(args_list[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--decode-reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--gguf", action="store_true", help="also the Q4_0 GGUF twin: loader packed vs llama.cpp")
    parser.add_argument("--threads", type=int, default=2, help="threads for the GGUF decode (torch = llama.cpp)")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args(args_list)
    folder = ensure_moe_checkpoint(args.out_dir / "qwen3-moe-1gb")
    meta = section_meta("bench_moe.py", args_list, folder, args.reps, REPO_ROOT)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load = measure_rotating([PATHS[name] for name in LOAD_PATHS], folder, shard_files(folder), max(1, args.reps),
                            args.out_dir, 900)
    decode = measure_decode(folder, max(1, args.decode_reps), args.tokens)
    section = render(load, decode, folder, meta)
    if args.gguf:
        section += render_gguf(*measure_gguf(folder, max(1, args.decode_reps), args.tokens, args.threads),
                               args.threads)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
