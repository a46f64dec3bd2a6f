"""Decode and prefill of the 1 GB Llama in bf16, W4A16, W8A8 and FP8, every CPU kernel the plugin offers.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_quantized_formats.py [--rounds 3] [--reps 5]
[--quiet-load 0.8] [--quiet-wait 1200] [--out-dir benchmarks/out] [--results benchmarks/RESULTS.md]``.

The dense bf16 Llama of the load benchmarks (``checkpoints.py``: hidden 2048, 8 layers, untied 32000-word
embedding and head) and three compressed-tensors checkpoints of it, written once under ``--out-dir`` (a
``.complete`` marker holds the spec), every decoder linear quantized and ``lm_head`` kept bf16 (``ignore``):

- W4A16: ``pack-quantized``, 4-bit symmetric, group 128, round to nearest (``tests/helpers`` packers);
- W8A8: ``int-quantized``, int8 per-channel weights, dynamic per-token int8 activations;
- FP8: ``float-quantized`` FP8_DYNAMIC, per-channel ``float8_e4m3fn`` weights, dynamic per-token activations.

Each (checkpoint, ``quantization_options={"kernel": ...}``) is loaded with ``dtype="bfloat16"`` on the CPU in a
fresh process (2 threads, page cache warm). The child warms up once, then times ``--reps`` repetitions of: a
fresh ``KVCache``, a 128-token prefill, one decode step (1 token after the 128 in the cache); medians. Memory:
RSS before the load, the RSS the load adds, the peak (``VmHWM``). ``--rounds`` rounds run every path, the order
reversed each round; the table gives medians over rounds and ratios to bf16. It waits (up to ``--quiet-wait``
seconds) for the 1-minute load average to fall under ``--quiet-load`` first, and records the load average at
the start and the end. The section goes to ``RESULTS.md`` between ``<!-- quantized-formats -->`` markers.
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

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache
from benchmarks.measure import peak_rss_bytes, rss_breakdown
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT, child_env

BENCH_DIR = Path(__file__).resolve().parent
TAG = "quantized-formats"
PROMPT = 128
THREADS = 2
GROUP = 128
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FORMATS = {"bf16": ("-",), "W4A16": ("auto", "int4pack", "dequantize"),
           "W8A8": ("auto", "int8pack", "int8_mm", "dequantized", "dequantize"),
           "FP8": ("auto", "dequantize", "scaled_mm")}
"""Each checkpoint and the kernels asked for (``-``: no option); the plugin's CPU kernels per format."""
PACKER_VERSION = "2"


def _w4a16(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric 4-bit round to nearest over groups of ``GROUP`` input columns, all groups at once (the test
    packer's ``quantize`` convention: scale ``2 amax / 15`` in float16, code ``round(w / scale) + 8``)."""
    from tests.helpers.compressed_tensors_checkpoints import ct_tensors
    from tests.helpers.gptq_checkpoints import Quantized

    n, k = weight.shape
    w = weight.to(torch.float32).reshape(n, k // GROUP, GROUP)
    scale = (w.abs().amax(-1) * 2 / 15).clamp(min=1e-4).to(torch.float16)  # [N, G]
    codes = torch.clamp(torch.round(w / scale.float().unsqueeze(-1)) + 8, 0, 15).to(torch.int32).reshape(n, k)
    quantized = Quantized(codes.t(), scale.t(), torch.full((k // GROUP, n), 8, dtype=torch.int32),
                          torch.arange(k, dtype=torch.int32) // GROUP, 4)
    return ct_tensors(quantized, sym=True)


def _w8a8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    from tests.helpers.int8_checkpoints import quantize_int8

    return quantize_int8(weight, "channel", symmetric=True)[0]


def _fp8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    from tests.helpers.fp8_checkpoints import fp8_tensors

    return fp8_tensors(weight, "ct-channel-token", (0, 0))[0]


def _quantization_config(fmt: str) -> dict[str, Any]:
    if fmt == "W4A16":
        from tests.helpers.compressed_tensors_checkpoints import ct_quantization_config

        return ct_quantization_config(4, GROUP, sym=True, actorder=False)
    if fmt == "W8A8":
        from tests.helpers.int8_checkpoints import int8_quantization_config, int8_scheme

        return int8_quantization_config(int8_scheme("channel", activations="token"))
    from tests.helpers.fp8_checkpoints import fp8_quantization_config

    return fp8_quantization_config("ct-channel-token")


def ensure_quantized(dense: Path, fmt: str, out_dir: Path) -> Path:
    """``dense`` with every decoder linear in ``fmt`` (the head and embedding kept), written once."""
    from safetensors.torch import load_file, save_file

    folder = out_dir / f"{dense.name}-ct-{fmt.lower()}"
    marker = folder / ".complete"
    spec = json.dumps({"dense": (dense / ".complete").read_text(), "format": fmt, "packer": PACKER_VERSION})
    if marker.is_file() and marker.read_text() == spec:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    pack = {"W4A16": _w4a16, "W8A8": _w8a8, "FP8": _fp8}[fmt]
    index: dict[str, Any] = {"metadata": {}, "weight_map": {}}
    for shard in shard_files(dense):
        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in load_file(shard).items():
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" and module.rpartition(".")[2] in LINEARS:
                tensors.update({f"{module}.{key}": value.contiguous() for key, value in pack(tensor).items()})
            else:
                tensors[name] = tensor
        save_file(tensors, folder / shard.name, metadata={"format": "pt"})
        index["weight_map"].update(dict.fromkeys(tensors, shard.name))
    config = json.loads((dense / "config.json").read_text())
    config["quantization_config"] = _quantization_config(fmt)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    marker.write_text(spec)
    return folder


def child(path: str, kernel: str, reps: int) -> dict[str, Any]:
    """In this fresh process: load, warm up once, time ``reps`` x (128-token prefill, one decode step)."""
    import loader
    from loader.layers import KVCache

    torch.set_num_threads(THREADS)
    before = rss_breakdown()["rss_bytes"]
    start = time.perf_counter()
    model, report = loader.load_model_with_report(
        path, dtype="bfloat16", quantization_options=None if kernel == "-" else {"kernel": kernel})
    load_s = time.perf_counter() - start
    loaded = rss_breakdown()["rss_bytes"]
    config: Any = model.config
    ids = torch.randint(3, config.vocab_size, (1, PROMPT + 1), generator=torch.Generator().manual_seed(0))

    def once() -> tuple[float, float]:
        cache = KVCache(config.num_hidden_layers)
        t0 = time.perf_counter()
        logits = model(ids[:, :PROMPT], cache=cache)
        t1 = time.perf_counter()
        model(logits[:, -1].argmax(-1, keepdim=True), cache=cache)
        return t1 - t0, time.perf_counter() - t1

    with torch.no_grad():
        once()
        timed = [once() for _ in range(reps)]
    quant = report.quantization or {}
    return {"load_s": load_s, "prefill_s": statistics.median(t[0] for t in timed),
            "decode_s": statistics.median(t[1] for t in timed), "before_rss": before, "load_rss": loaded - before,
            "peak_rss": peak_rss_bytes(), "kernels": quant.get("kernels", {}),
            "model_bytes": sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])}


def _run_child(folder: Path, kernel: str, reps: int) -> dict[str, Any]:
    warm_page_cache(shard_files(folder))
    load = os.getloadavg()[0]
    env = {**child_env(BENCH_DIR / "out" / "pycache"), "OMP_NUM_THREADS": str(THREADS)}
    done = subprocess.run([sys.executable, __file__, "--child", str(folder), kernel, str(reps)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        return {"error": done.stderr.strip()[-3000:] or f"exit {done.returncode}", "load_avg": load}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load_avg": load}


def _wait_quiet(limit: float, seconds: float) -> str:
    """Wait until the 1-minute load average is under ``limit`` (at most ``seconds``); say how it went."""
    start = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - start < seconds:
        print(f"load average {os.getloadavg()[0]:.2f} >= {limit}: waiting", file=sys.stderr, flush=True)
        time.sleep(30)
    waited = time.monotonic() - start
    quiet = os.getloadavg()[0] < limit
    return (f"{'quiet' if quiet else 'NOT quiet'} (1-min load < {limit} {'reached' if quiet else 'not reached'} "
            f"after {waited / 60:.1f} min of waiting)")


def _loadavg() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def measure(folders: dict[str, Path], rounds: int, reps: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every (format, kernel) once per round in a fresh process, the order reversed every other round."""
    paths = [(fmt, kernel) for fmt, kernels in FORMATS.items() for kernel in kernels]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {path: [] for path in paths}
    for r in range(rounds):
        for fmt, kernel in paths if r % 2 == 0 else paths[::-1]:
            record = _run_child(folders[fmt], kernel, reps)
            print(f"round {r + 1} {fmt} {kernel}: "
                  f"{record.get('error', '').splitlines()[-1:] or round(record['decode_s'] * 1e3, 1)}",
                  file=sys.stderr, flush=True)
            runs[(fmt, kernel)].append(record)
    return runs


def _med(records: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in records)


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def _kernels(records: list[dict[str, Any]]) -> str:
    counts = records[0]["kernels"]
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items())) or "dense"


def _table(runs: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    base = [r for r in runs[("bf16", "-")] if "error" not in r]
    b_pre, b_dec = (_med(base, "prefill_s"), _med(base, "decode_s")) if base else (None, None)
    lines = ["| format | kernel asked | layers got | load s | prefill 128 s | ÷ bf16 | decode step ms "
             "| min-max ms | ÷ bf16 | params + buffers | RSS added by load | peak RSS (VmHWM) | 1-min load at starts |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (fmt, kernel), records in runs.items():
        ok = [r for r in records if "error" not in r]
        if not ok:
            lines.append(f"| {fmt} | {kernel} | **failed** | | | | | | | | | | |")
            continue
        pre, dec = _med(ok, "prefill_s"), _med(ok, "decode_s")
        decs = [r["decode_s"] * 1e3 for r in ok]
        lines.append(
            f"| {fmt} | {kernel} | {_kernels(ok)} | {_med(ok, 'load_s'):.2f} | {pre:.3f} | "
            f"{pre / b_pre if b_pre else float('nan'):.2f} | {dec * 1e3:.1f} | {min(decs):.1f}-{max(decs):.1f} | "
            f"{dec / b_dec if b_dec else float('nan'):.2f} | {_mib(_med(ok, 'model_bytes'))} | "
            f"{_mib(_med(ok, 'load_rss'))} | {_mib(_med(ok, 'peak_rss'))} | "
            f"{min(r['load_avg'] for r in records):.1f}-{max(r['load_avg'] for r in records):.1f} |")
    return lines


def render(runs: dict[tuple[str, str], list[dict[str, Any]]], meta: dict[str, str], quiet: str, end_load: str,
           rounds: int, reps: int, sizes: dict[str, int]) -> str:
    """The section for ``RESULTS.md``."""
    before = [r["before_rss"] for records in runs.values() for r in records if "error" not in r]
    out = ["## Quantized formats on the CPU: W4A16, W8A8, FP8 against bf16 (issue 30)", "",
           f"- Date: {meta['date']}", f"- Machine: {meta['machine']}", f"- Software: {meta['software']}",
           f"- Environment: {meta['environment']}; at the end {end_load}; machine {quiet}",
           f"- Command: `OMP_NUM_THREADS={THREADS} {meta['command']}`", "",
           f"`{meta['checkpoint']}` (bf16) and its compressed-tensors twins (every decoder linear quantized, "
           "embedding and `lm_head` bf16; checkpoint bytes: "
           + ", ".join(f"{fmt} {size / 1e9:.2f} GB" for fmt, size in sizes.items())
           + f"). Loaded with `dtype=\"bfloat16\"` on the CPU, {THREADS} threads, each (format, kernel) in a "
           f"fresh process, {rounds} rounds with the order reversed every other round; in each child one "
           f"warm-up, then {reps} x (fresh `KVCache`, {PROMPT}-token prefill, one decode step) and the medians. "
           "Figures are medians over the rounds (min-max of the decode step over the rounds); ÷ bf16 against "
           "the dense checkpoint. `layers got`: the kernels the load chose (`LoadReport.quantization`). "
           f"`1-min load at starts`: the load average as each child started (the previous child's {THREADS} "
           "threads alone keep it near 2: more means someone else was running). "
           f"RSS before the load (Python, torch, loader imported): {_mib(statistics.median(before) if before else 0)}."
           , ""]
    out += _table(runs)
    failures = [(fmt, kernel, r["error"]) for (fmt, kernel), records in runs.items() for r in records
                if "error" in r]
    if failures:
        out += ["", "Failures:", ""]
        out += [f"- {fmt} `{kernel}`:\n\n```\n{error}\n```" for fmt, kernel, error in failures[:4]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list and args_list[0] == "--child":
        print(json.dumps(child(args_list[1], args_list[2], int(args_list[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quiet-load", type=float, default=0.8, help="1-minute load average to wait for")
    parser.add_argument("--quiet-wait", type=float, default=1200, help="seconds to wait for it at most")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args(args_list)
    dense = ensure_checkpoint(args.out_dir, 1.0)[0]
    folders = {"bf16": dense, **{fmt: ensure_quantized(dense, fmt, args.out_dir) for fmt in FORMATS if fmt != "bf16"}}
    sizes = {fmt: sum(f.stat().st_size for f in shard_files(folder)) for fmt, folder in folders.items()}
    quiet = _wait_quiet(args.quiet_load, args.quiet_wait)
    meta = section_meta("bench_quantized_formats.py", args_list, dense, args.reps, REPO_ROOT)
    runs = measure(folders, max(1, args.rounds), max(1, args.reps))
    section = render(runs, meta, quiet, f"load average {_loadavg()}", args.rounds, args.reps, sizes)
    print(section)
    write_section(args.results, TAG, section)
    return 1 if any("error" in r for records in runs.values() for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
