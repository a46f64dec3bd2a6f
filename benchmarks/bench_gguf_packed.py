"""GGUF kept packed against the dequantized loads and llama.cpp: load-to-ready, memory, greedy decode.

One run, side by side, each path in a fresh process (the order alternating between repetitions, medians
of ``--reps``), for SmolLM2-135M-Instruct Q4_1 (``scripts/fetch_smollm2.py``) and, with ``--big``, a
1 GB-class random Llama in Q4_0 and in Q4_K written once with gguf-py (``benchmarks/gguf_checkpoints.py``):

- ``packed``: ``load_model(quantization="gguf", dtype="float32")`` — Q4 blocks repacked for torch's int4
  kernel, the rest float32 (what issue 17's first slice measured; the kernel computes in bfloat16);
- ``packed-nocache``: the same with ``format_options={"packed_cache": False}``: every load packs again
  (without it the first load of a file writes its packed-weights bundle and the later ones map it; the
  children's ``LOADER_CACHE_DIR`` is ``benchmarks/out/cache``, whose bundles are removed before each file);
- ``packed-bf16``: the same with ``dtype="bfloat16"`` (activations bfloat16 throughout, no casts);
- ``dequant-f32`` / ``dequant-bf16``: ``load_model(dtype="float32")`` and ``load_model(dtype="bfloat16",
  format_options={"dequantize": True})``, every block dequantized at load (a bfloat16 load of a GGUF file
  otherwise stays packed);
- ``llama.cpp``: ``llama_cpp.Llama(path, n_threads=T, n_threads_batch=T)`` (mmap, CPU only), from the pinned
  ``llama-cpp-python`` the benchmark builds in its own virtualenv (``benchmarks/llamacpp_venv.py``).

Per path: load-to-ready seconds (the clock around the load call only), RSS the load added (after minus
before, ``/proc/self/statm``) and RSS added once decoding is done (llama.cpp maps the file and touches its
pages only as it computes), peak RSS, and greedy decoding of exactly ``--tokens`` tokens (end-of-sequence
ignored) after the same prompt token ids — SmolLM2's chat template around "What is the capital of France?",
encoded once by loader's tokenizer and handed to every path — with the same thread count for torch
(``torch.set_num_threads``) and llama.cpp (``n_threads``): prefill seconds (prompt forward to the first
token) and decode tokens/s over the tokens after the first. The first words of each path's output are
printed so a wrong answer is seen. Ratios are against ``dequant-f32`` (decode) and ``llama.cpp`` (load).

With ``--warm`` every process (loader's and llama.cpp's alike) first loads a one-layer Q4_0 Llama with
SmolLM2's tokenizer (``gguf_checkpoints.ensure_warm_up_gguf``), untimed, so the timed load finds the library
imported and initialised as in a serving process; without it the timed load is the process's first (loader's
then includes importing its pipeline and plugins, llama.cpp's its backends' initialisation).

Usage: ``.venv/bin/python benchmarks/bench_gguf_packed.py [--reps 3] [--tokens 32] [--threads 2] [--big]
[--warm] [--json out.json]``. Nothing is asserted: it measures and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
QUESTION = "What is the capital of France?"
LOADER_PATHS: dict[str, dict[str, Any]] = {
    "packed": {"quantization": "gguf", "dtype": "float32"},
    # every load packs again: the packed-weights bundle neither read nor written
    "packed-nocache": {"quantization": "gguf", "dtype": "float32", "format_options": {"packed_cache": False}},
    "packed-bf16": {"quantization": "gguf", "dtype": "bfloat16"},
    "dequant-f32": {"dtype": "float32"},
    # since GGUF stays packed for dtype auto/bfloat16, the dequantized bfloat16 model needs the option by name
    "dequant-bf16": {"dtype": "bfloat16", "format_options": {"dequantize": True}},
}
LLAMA_CPP = "llama.cpp"
_KEYS = ("load_s", "rss_added", "rss_after_decode", "peak_rss", "prefill_s", "decode_tok_s")

_RSS = r"""
import os, resource, time
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

_LOADER_CHILD = _RSS + r"""
import gc, json, sys
import torch
import loader
from loader._generation import greedy_tokens

path, options, prompt_ids, tokens, threads = (sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]),
                                              int(sys.argv[4]), int(sys.argv[5]))
torch.set_num_threads(threads)
if sys.argv[6:]:  # warm: the library imported and initialised by a load of another (tiny) file first
    warm_up = loader.load_model(sys.argv[6], **options)
    del warm_up
gc.collect()
before = rss()
t0 = time.perf_counter()
model = loader.load_model(path, **options)
load_s = time.perf_counter() - t0
added = rss() - before
t1 = time.perf_counter()
steps = greedy_tokens(model, prompt_ids, tokens)
out = [next(steps)]
t2 = time.perf_counter()
out.extend(steps)
t3 = time.perf_counter()
print(json.dumps({"load_s": load_s, "rss_added": added, "rss_after_decode": rss() - before, "peak_rss": peak(),
                  "prefill_s": t2 - t1, "decode_tok_s": (len(out) - 1) / (t3 - t2), "ids": out,
                  "threads": torch.get_num_threads()}))
"""

_LLAMA_CPP_CHILD = _RSS + r"""
import json, sys
import llama_cpp

path, prompt_ids, tokens, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if sys.argv[5:]:  # warm, as the loader child
    warm_up = llama_cpp.Llama(model_path=sys.argv[5], n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                              n_ctx=64, use_mmap=True, verbose=False)
    del warm_up
before = rss()
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                      n_ctx=len(prompt_ids) + tokens + 16, use_mmap=True, verbose=False)
load_s = time.perf_counter() - t0
added = rss() - before
t1 = time.perf_counter()
steps = llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
out = [next(steps)]
t2 = time.perf_counter()
for token in steps:
    out.append(token)
    if len(out) == tokens:
        break
t3 = time.perf_counter()
print(json.dumps({"load_s": load_s, "rss_added": added, "rss_after_decode": rss() - before, "peak_rss": peak(),
                  "prefill_s": t2 - t1, "decode_tok_s": (len(out) - 1) / (t3 - t2), "ids": out,
                  "threads": threads, "version": llama_cpp.__version__}))
"""


CACHE = OUT / "cache"
"""The loader children's ``LOADER_CACHE_DIR``: its packed-weights bundles are removed before each file's run, so
the first ``packed`` load packs and writes the bundle and the later ones map it."""


def _child(command: list[str], what: str) -> dict[str, Any]:
    env = {**os.environ, "TQDM_DISABLE": "1", "LOADER_CACHE_DIR": str(CACHE)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_once(name: str, path: Path, prompt_ids: list[int], tokens: int, threads: int,
             llamacpp: Path | None, warm_up: Path | None = None) -> dict[str, Any]:
    """One fresh process of path ``name`` on the GGUF at ``path`` (loading ``warm_up`` first, untimed, if given)."""
    ids, count, n = json.dumps(prompt_ids), str(tokens), str(threads)
    first = [str(warm_up)] if warm_up is not None else []
    if name == LLAMA_CPP:
        if llamacpp is None:
            raise ValueError("llama.cpp asked for without its virtualenv")
        return _child([str(llamacpp), "-c", _LLAMA_CPP_CHILD, str(path), ids, count, n, *first], name)
    options = json.dumps(LOADER_PATHS[name])
    return _child([sys.executable, "-c", _LOADER_CHILD, str(path), options, ids, count, n, *first], name)


def _median_table(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: {key: statistics.median(r[key] for r in records) for key in _KEYS} | {"ids": records[-1]["ids"]}
            for name, records in runs.items()}


def bench_file(label: str, path: Path, names: list[str], prompt_ids: list[int], args: argparse.Namespace,
               llamacpp: Path | None, decode: Any) -> dict[str, Any]:
    """Every path on one file, ``args.reps`` rounds in alternating order; prints and returns the medians."""
    path.read_bytes()  # warm the page cache: every path then reads from memory
    shutil.rmtree(CACHE / "gguf-packed", ignore_errors=True)  # the first packed load writes the bundle
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else list(reversed(names))):
            print(f"  {label}: rep {rep + 1}/{args.reps} {name} ...", file=sys.stderr, flush=True)
            runs[name].append(run_once(name, path, prompt_ids, args.tokens, args.threads, llamacpp, args.warm_up))
    table = _median_table(runs)
    size = path.stat().st_size
    base_decode = table.get("dequant-f32", {}).get("decode_tok_s")
    base_load = table.get(LLAMA_CPP, {}).get("load_s")
    print(f"\n### {label} ({path.name}, {size / 1e6:.0f} MB), median of {args.reps}\n")
    print("| path | load s | ÷ llama.cpp | RSS added | after decode | ÷ file | peak RSS | prefill s | decode tok/s "
          "| ÷ dequant-f32 | output |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, row in table.items():
        load_ratio = f"{row['load_s'] / base_load:.2f}x" if base_load else "—"
        decode_ratio = f"{row['decode_tok_s'] / base_decode:.2f}x" if base_decode else "—"
        text = decode(row["ids"])[:40].replace("|", "/").replace("\n", " ")
        print(f"| {name} | {row['load_s']:.3f} | {load_ratio} | {row['rss_added'] / 1e6:.0f} MB "
              f"| {row['rss_after_decode'] / 1e6:.0f} MB | {row['rss_added'] / size:.2f}x "
              f"| {row['peak_rss'] / 1e6:.0f} MB | {row['prefill_s']:.3f} | {row['decode_tok_s']:.1f} "
              f"| {decode_ratio} | {text!r} |")
    for name in ("packed", "packed-bf16"):
        if len(runs.get(name, ())) > 1:
            later = statistics.median(r["load_s"] for r in runs[name][1:])
            first = runs[name][0]["load_s"]
            base = f" (÷ llama.cpp {later / base_load:.2f}x)" if base_load else ""
            print(f"\n{name}: first load {first:.3f} s (packs, writes the bundle), later loads {later:.3f} s{base} "
                  "(median; the bundle mapped)")
    sys.stdout.flush()
    return {"file": str(path), "bytes": size, "runs": runs, "median": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32, help="tokens to decode (EOS ignored)")
    parser.add_argument("--big-tokens", type=int, default=16, help="tokens to decode on the 1 GB-class files")
    parser.add_argument("--threads", type=int, default=2, help="torch threads = llama.cpp n_threads")
    parser.add_argument("--paths", default=",".join([*LOADER_PATHS, LLAMA_CPP]),
                        help="comma-separated subset of: " + ", ".join([*LOADER_PATHS, LLAMA_CPP]))
    parser.add_argument("--big", action="store_true", help="also the 1 GB-class Q4_0 and Q4_K Llamas")
    parser.add_argument("--json", type=Path, help="also write every run here")
    parser.add_argument("--warm", action="store_true",
                        help="each process loads a one-layer GGUF first (untimed): the timed load then finds the "
                             "library imported and initialised, as in a serving process, on every path alike")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = sorted(set(names) - {*LOADER_PATHS, LLAMA_CPP})
    if unknown:
        parser.error(f"unknown paths {unknown}")

    sys.path.insert(0, str(REPO / "scripts"))
    sys.path.insert(0, str(REPO))
    from fetch_smollm2 import fetch_smollm2

    from benchmarks.llamacpp_venv import LLAMA_CPP_PYTHON, llamacpp_python
    from loader._generation import encode_prompt, tokenizer_for

    smollm2 = Path(fetch_smollm2())
    if args.warm:
        from benchmarks.gguf_checkpoints import ensure_warm_up_gguf

        args.warm_up = ensure_warm_up_gguf(OUT, smollm2)
    else:
        args.warm_up = None
    llamacpp = llamacpp_python() if LLAMA_CPP in names else None
    bundle = tokenizer_for(str(smollm2))
    prompt_ids = encode_prompt(bundle, QUESTION, chat=True)

    def decode(ids: list[int]) -> str:
        return str(bundle.tokenizer.decode(ids, skip_special_tokens=True))

    mode = "warm (a one-layer GGUF loaded first in each process)" if args.warm else "cold (first load per process)"
    print("$ " + shlex.join([Path(sys.executable).name, *sys.argv]))
    from benchmarks.machine import describe_machine

    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {describe_machine()}, threads {args.threads}, "
          f"load average {os.getloadavg()[0]:.1f} at start, {LLAMA_CPP_PYTHON if llamacpp else 'no llama.cpp'}, "
          f"prompt {len(prompt_ids)} tokens, decode {args.tokens} tokens ({args.big_tokens} on the 1 GB files), "
          f"{mode}")
    results = {"smollm2": bench_file("SmolLM2-135M-Instruct Q4_1", smollm2, names, prompt_ids, args, llamacpp,
                                     decode)}
    if args.big:
        from benchmarks.gguf_checkpoints import QTYPES, ensure_gguf_llama

        big = argparse.Namespace(**{**vars(args), "tokens": args.big_tokens})
        for qtype in QTYPES:
            path = ensure_gguf_llama(OUT, qtype, smollm2)
            results[qtype] = bench_file(f"1 GB-class random Llama {qtype}", path, names, prompt_ids, big, llamacpp,
                                        decode)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
