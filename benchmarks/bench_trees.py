"""The same loads from two source trees of loader, alternating fresh processes: did a change slow anything?

Usage: ``.venv/bin/python benchmarks/bench_trees.py --before /tmp/base [--after .] [--reps 5] [--cases ...]``
(``git worktree add /tmp/base <commit>`` makes the before tree). Each child runs with ``PYTHONPATH`` naming one
tree's ``core`` and ``plugins/*/src`` first, so it imports that tree's loader and plugins (it prints where
``loader`` came from, and the parent checks it); the order of the two trees alternates between repetitions.

Cases (each on a checkpoint written once under ``--out``):

- ``safetensors``: ``load_model`` of the 1 GB random bf16 Llama of ``run_all.py`` (mapped weights);
- ``gguf``: the real SmolLM2-135M Q4_1 GGUF kept packed (the packed-weights bundle off, so every load packs),
  then greedy decode of ``--tokens`` tokens;
- ``gptq``: the 1 GB Llama as symmetric 4-bit GPTQ (group 128) on the packed int4 CPU kernel, then one forward
  of ``--tokens`` tokens after a warm-up forward.

Prints a Markdown table: medians per tree and after ÷ before (above 1: the after tree is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CASES = ("safetensors", "gguf", "gptq")

_CHILD = r"""
import json, sys, time
import torch
import loader
case, path, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
start = time.perf_counter()
dtype = "float32" if case == "gguf" else "bfloat16"
model = loader.load_model(path, dtype=dtype)
result = {"origin": loader.__file__, "load_s": time.perf_counter() - start}
with torch.no_grad():
    if case == "gguf":
        from loader._generation import greedy_tokens
        start = time.perf_counter()
        produced = list(greedy_tokens(model, [1, 2, 3, 4], tokens))
        result["decode_tok_s"] = len(produced) / (time.perf_counter() - start)
    elif case == "gptq":
        ids = torch.randint(0, 32000, (1, tokens), generator=torch.Generator().manual_seed(0))
        model(ids)
        start = time.perf_counter()
        model(ids)
        result["forward_s"] = time.perf_counter() - start
print(json.dumps(result))
"""


def tree_pythonpath(tree: Path) -> str:
    """``tree``'s core and every plugin's ``src``, ahead of whatever the venv installed."""
    return os.pathsep.join([str(tree / "core"), *(str(p) for p in sorted(tree.glob("plugins/*/src")))])


def run_child(tree: Path, case: str, path: Path, tokens: int, cache: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree_pythonpath(tree), "TQDM_DISABLE": "1",
           "LOADER_CACHE_DIR": str(cache), "LOADER_GGUF_PACKED_CACHE": "0"}
    done = subprocess.run([sys.executable, "-c", _CHILD, case, str(path), str(tokens)], capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir(), check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{case} from {tree} failed: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    origin = Path(result.pop("origin")).resolve()
    if not origin.is_relative_to(tree.resolve()):
        raise RuntimeError(f"{case}: the child imported loader from {origin}, not from {tree}")
    return result


def checkpoint_for(case: str, out: Path) -> Path:
    """The checkpoint a case loads, written on first use."""
    from benchmarks.checkpoints import ensure_checkpoint

    if case == "gguf":
        sys.path.insert(0, str(REPO / "scripts"))
        from fetch_smollm2 import fetch_smollm2

        return Path(fetch_smollm2())
    dense, _, _ = ensure_checkpoint(out, 1.0)
    if case == "safetensors":
        return dense
    from benchmarks.bench_gptq_forward import ensure_gptq

    return ensure_gptq(dense, out / f"{dense.name}-gptq")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare against")
    parser.add_argument("--after", type=Path, default=REPO, help="the changed source tree (default: this one)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as cache:
        for case in cases:
            path = checkpoint_for(case, args.out)
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for name, tree in trees.items():  # untimed: bytecode compiled, page cache warm
                run_child(tree, case, path, args.tokens, Path(cache) / name)
            for rep in range(args.reps):
                order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                for name in order:
                    runs[name].append(run_child(trees[name], case, path, args.tokens, Path(cache) / name))
            for metric in runs["before"][0]:
                before = statistics.median(r[metric] for r in runs["before"])
                after = statistics.median(r[metric] for r in runs["after"])
                rows.append((case, metric, before, after))
    print(f"`{' '.join(sys.argv)}`; {args.reps} alternating repetitions, medians\n")
    print("| case | metric | before | after | after ÷ before |\n|---|---|---:|---:|---:|")
    for case, metric, before, after in rows:
        print(f"| {case} | {metric} | {before:.4g} | {after:.4g} | {after / before:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
