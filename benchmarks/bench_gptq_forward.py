"""One forward of a 1 GB-class GPTQ Llama on the CPU: packed int4 kernel vs dequantize + matmul vs the bf16 model.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_gptq_forward.py [--out benchmarks/out] [--tokens 16]
[--models 1gb tinyllama]``.

Two random bf16 Llamas (written once, cached under ``--out``):

- ``1gb``: the 1 GB Llama of the load benchmarks (hidden 2048, 8 layers, untied 32000-word embedding and head:
  the two are 26 % of its weights, an unusual share);
- ``tinyllama``: the standard 1.1B Llama shape (TinyLlama-1.1B: hidden 2048, 22 layers, intermediate 5632,
  32 heads, 4 KV heads, vocab 32000, untied; 2.2 GB bf16), what a "1 GB-class quantized Llama" usually is.

Each is quantized to 4-bit GPTQ (symmetric, group 128, round to nearest, packed by
``tests/helpers/gptq_checkpoints.py``'s ``pack_gptq``; GPTQModel itself is not used: its calibrated GPTQ runs a
Hessian solve per layer over calibration data, hours for 1.1B on this 2-core CPU), once with the decoder linears
only (GPTQModel's default) and once with the untied ``lm_head`` too (its ``lm_head=True``). Each path is then
loaded in a fresh process (so peak RSS is the path's own): load seconds, one forward of ``--tokens`` tokens
(after one untimed forward, except dequantize + matmul, which is timed on its first), and memory from
``/proc/self/status``: the RSS before the load (Python, torch and loader imported), the RSS the load adds, the
peak (``VmHWM``), and the parameters + buffers. Prints Markdown tables for ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.checkpoints import LlamaShape, ensure_checkpoint, ensure_shape_checkpoint, shard_files  # noqa: E402
from benchmarks.measure import peak_rss_bytes, rss_breakdown  # noqa: E402
from tests.helpers.gptq_checkpoints import Quantized, gptq_quantization_config, pack_gptq  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP = 128
TINYLLAMA = LlamaShape(hidden=2048, intermediate=5632, heads=32, kv_heads=4, layers=22)
"""TinyLlama-1.1B's shape (head_dim 64, untied embedding and head)."""


def _quantize(weight: torch.Tensor) -> Quantized:
    """Symmetric 4-bit round to nearest over contiguous groups (vectorized; same convention as the test packer)."""
    n, k = weight.shape
    w = weight.to(torch.float32).reshape(n, k // GROUP, GROUP)
    scale = (w.abs().amax(-1) * 2 / 15).clamp(min=1e-6).to(torch.float16)  # [N, G]
    codes = torch.clamp(torch.round(w / scale.float().unsqueeze(-1)) + 8, 0, 15).to(torch.int32).reshape(n, k)
    g_idx = (torch.arange(k) // GROUP).to(torch.int32)
    return Quantized(codes.t().contiguous(), scale.t().contiguous(), torch.full((k // GROUP, n), 8, dtype=torch.int32),
                     g_idx, 4)


def ensure_gptq(dense: Path, folder: Path, *, lm_head: bool = False) -> Path:
    """The GPTQ form of ``dense``; ``lm_head``: quantize the (untied) head too, as GPTQModel's ``lm_head=True``."""
    from safetensors.torch import load_file, save_file

    packed = (*LINEARS, "lm_head") if lm_head else LINEARS
    marker = folder / ".complete"
    if marker.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    index = {"metadata": {}, "weight_map": {}}
    for shard in shard_files(dense):
        tensors = {}
        for name, tensor in load_file(shard).items():
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" and module.rpartition(".")[2] in packed:
                for key, value in pack_gptq(_quantize(tensor)).items():
                    tensors[f"{module}.{key}"] = value
            else:
                tensors[name] = tensor
        save_file(tensors, folder / shard.name, metadata={"format": "pt"})
        index["weight_map"].update({name: shard.name for name in tensors})
    config = json.loads((dense / "config.json").read_text())
    config["quantization_config"] = gptq_quantization_config(4, GROUP, sym=True, desc_act=False, lm_head=lm_head)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    marker.write_text("ok")
    return folder


def child(path: str, kernel: str | None, tokens: int) -> None:
    import loader

    options = {"kernel": kernel} if kernel else None
    before = rss_breakdown()
    imported = before["rss_bytes"]
    start = time.perf_counter()
    model = loader.load_model(path, dtype="bfloat16", quantization_options=options)
    load_s = time.perf_counter() - start
    after = rss_breakdown()
    loaded = after["rss_bytes"]
    model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if kernel != "dequantize":
            model(ids)
        start = time.perf_counter()
        model(ids)
        forward_s = time.perf_counter() - start
    print(json.dumps({"load_s": load_s, "forward_s": forward_s, "peak_rss": peak_rss_bytes(),
                      "before_rss": imported, "load_rss": loaded - imported, "model_bytes": model_bytes,
                      "load_anon": after["rss_anon_bytes"] - before["rss_anon_bytes"],
                      "load_file": after["rss_file_bytes"] - before["rss_file_bytes"]}))


def _dense(out: Path, model: str) -> tuple[Path, LlamaShape]:
    if model == "1gb":
        folder, shape, _ = ensure_checkpoint(out, 1.0)
    else:
        folder, shape, _ = ensure_shape_checkpoint(out, "llama-tinyllama-1.1b", TINYLLAMA)
    return folder, shape


def _measure(dense: Path, out: Path, tokens: int) -> list[tuple[str, dict[str, float]]]:
    gptq = ensure_gptq(dense, out / f"{dense.name}-gptq")
    gptq_head = ensure_gptq(dense, out / f"{dense.name}-gptq-lm-head", lm_head=True)
    rows = []
    for label, path, kernel in (("bf16 model", dense, "-"), ("GPTQ 4-bit, int4pack", gptq, "-"),
                                ("GPTQ 4-bit + lm_head, int4pack", gptq_head, "-"),
                                ("GPTQ 4-bit, dequantize + matmul", gptq, "dequantize")):
        done = subprocess.run([sys.executable, __file__, "--tokens", str(tokens), "--child", str(path), kernel],
                              capture_output=True, text=True, env={**os.environ}, check=True)
        rows.append((label, json.loads(done.stdout.strip().splitlines()[-1])))
    return rows


def _table(shape: LlamaShape, tokens: int, rows: list[tuple[str, dict[str, float]]]) -> None:
    base = rows[0][1]
    gib = 2**30
    print(f"Llama hidden {shape.hidden}, {shape.layers} layers, intermediate {shape.intermediate}, "
          f"{shape.heads} heads / {shape.kv_heads} KV heads, vocab {shape.vocab}, untied "
          f"({shape.parameter_bytes / 1e9:.2f} GB bf16); one forward of {tokens} tokens, bfloat16; "
          f"RSS before the load {base['before_rss'] / gib:.2f} GiB (Python, torch, loader)\n")
    print("| path | load s | forward s | ÷ bf16 | parameters + buffers | ÷ bf16 | RSS added by the load | ÷ bf16 "
          "| of it anon / file | peak above pre-load RSS | ÷ bf16 | whole-process peak | ÷ bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        above, base_above = r["peak_rss"] - r["before_rss"], base["peak_rss"] - base["before_rss"]
        print(f"| {label} | {r['load_s']:.2f} | {r['forward_s']:.3f} | {r['forward_s'] / base['forward_s']:.2f} | "
              f"{r['model_bytes'] / gib:.2f} GiB | {r['model_bytes'] / base['model_bytes']:.3f} | "
              f"{r['load_rss'] / gib:.2f} GiB | {r['load_rss'] / base['load_rss']:.3f} | "
              f"{r['load_anon'] / gib:.2f} / {r['load_file'] / gib:.2f} GiB | "
              f"{above / gib:.2f} GiB | {above / base_above:.3f} | "
              f"{r['peak_rss'] / gib:.2f} GiB | {r['peak_rss'] / base['peak_rss']:.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--models", nargs="+", choices=("1gb", "tinyllama"), default=["1gb", "tinyllama"])
    parser.add_argument("--child", nargs=2, metavar=("PATH", "KERNEL"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], None if args.child[1] == "-" else args.child[1], args.tokens)
        return
    for model in args.models:
        dense, shape = _dense(args.out, model)
        _table(shape, args.tokens, _measure(dense, args.out, args.tokens))


if __name__ == "__main__":
    main()
