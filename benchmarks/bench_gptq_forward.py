"""One forward of a 1 GB-class GPTQ Llama on the CPU: packed int4 kernel vs dequantize + matmul vs the bf16 model.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_gptq_forward.py [--out benchmarks/out] [--tokens 16]``.
Writes (once) the 1 GB bf16 Llama of the load benchmarks and its 4-bit GPTQ forms (symmetric, group 128,
round to nearest with ``tests/helpers/gptq_checkpoints.py``'s packing; once with the decoder linears only, as
GPTQModel's default, once with the untied ``lm_head`` too, as its ``lm_head=True``), then loads each path in a fresh
process (so peak RSS is the path's own): load seconds, one forward of ``--tokens`` tokens (after one
untimed forward, except dequantize + matmul, which is timed on its first), and peak RSS (``VmHWM``).
Prints a Markdown table for ``RESULTS.md``.
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

from benchmarks.checkpoints import ensure_checkpoint, shard_files  # noqa: E402
from benchmarks.measure import peak_rss_bytes, rss_breakdown  # noqa: E402
from tests.helpers.gptq_checkpoints import Quantized, gptq_quantization_config, pack_gptq  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP = 128


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
                      "load_rss": loaded - imported, "model_bytes": model_bytes,
                      "load_anon": after["rss_anon_bytes"] - before["rss_anon_bytes"],
                      "load_file": after["rss_file_bytes"] - before["rss_file_bytes"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--child", nargs=2, metavar=("PATH", "KERNEL"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], None if args.child[1] == "-" else args.child[1], args.tokens)
        return
    dense, shape, _ = ensure_checkpoint(args.out, 1.0)
    gptq = ensure_gptq(dense, args.out / "llama-1gb-gptq")
    gptq_head = ensure_gptq(dense, args.out / "llama-1gb-gptq-lm-head", lm_head=True)
    rows = []
    for label, path, kernel in (("bf16 model", dense, "-"), ("GPTQ 4-bit, int4pack", gptq, "-"),
                                ("GPTQ 4-bit + lm_head, int4pack", gptq_head, "-"),
                                ("GPTQ 4-bit, dequantize + matmul", gptq, "dequantize")):
        done = subprocess.run([sys.executable, __file__, "--tokens", str(args.tokens), "--child", str(path), kernel],
                              capture_output=True, text=True, env={**os.environ}, check=True)
        rows.append((label, json.loads(done.stdout.strip().splitlines()[-1])))
    base = rows[0][1]
    print(f"Llama hidden {shape.hidden}, {shape.layers} layers, vocab {shape.vocab} "
          f"({shape.parameter_bytes / 1e9:.2f} GB bf16); one forward of {args.tokens} tokens, bfloat16\n")
    print("| path | load s | forward s | forward ÷ bf16 | peak RSS | ÷ bf16 | RSS added by the load | ÷ bf16 "
          "| of it anon / file-mapped | parameters + buffers | ÷ bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        print(f"| {label} | {r['load_s']:.2f} | {r['forward_s']:.3f} | {r['forward_s'] / base['forward_s']:.2f} | "
              f"{r['peak_rss'] / 2**30:.2f} GiB | {r['peak_rss'] / base['peak_rss']:.2f} | "
              f"{r['load_rss'] / 2**30:.2f} GiB | {r['load_rss'] / base['load_rss']:.2f} | "
              f"{r['load_anon'] / 2**30:.2f} / {r['load_file'] / 2**30:.2f} GiB | "
              f"{r['model_bytes'] / 2**30:.2f} GiB | {r['model_bytes'] / base['model_bytes']:.2f} |")


if __name__ == "__main__":
    main()
