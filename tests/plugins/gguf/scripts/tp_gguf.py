"""Run under ``torchrun``: load each GGUF file, save this rank's logits and bytes read.

Usage: ``python -m torch.distributed.run --nproc-per-node N tp_gguf.py OUT FILE...``; writes
``OUT/rank<R>.json`` mapping each file to ``{"logits": path, "bytes_read": n, "packed_logits": path,
"exact_packed_logits": path, "mapped_logits": path, "mapped_cache": report}`` and each packed load's per-layer
kernels (``"<key>_layers"``): float32 dequantized, then the default load (packed where a kernel exists), then
packed with the kernel computing in float32 (``format_options={"kernel_dtype": "float32"}``), then the default
load twice with the packed-weights bundle on, the second mapping what the first wrote.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from loader._pipeline.load import load_model_with_report
from tests.helpers.torchrun_exit import exit_rank


def main(out: Path, files: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for i, file in enumerate(files):
        model, report = load_model_with_report(file, dtype="float32")
        ids = torch.arange(24).view(2, 12) % 200
        with torch.no_grad():
            logits = model(ids)
        saved = out / f"{i}-rank{rank}.pt"
        torch.save(logits, saved)
        results[file] = {"logits": str(saved), "bytes_read": report.bytes_read, "tp_size": report.tp_size}
        for key, options in (("packed_logits", None), ("exact_packed_logits", {"kernel_dtype": "float32"})):
            packed, packed_report = load_model_with_report(file, format_options=options)
            with torch.no_grad():
                packed_logits = packed(ids)
            packed_saved = out / f"{i}-rank{rank}-{key}.pt"
            torch.save(packed_logits, packed_saved)
            results[file][key] = str(packed_saved)
            results[file][f"{key}_layers"] = {name: layer["kernel"] for name, layer in
                                              packed_report.quantization["layers"].items()}
        # the packed-weights bundle (this rank's own): the first load writes it, the second maps it
        bundle = {"packed_cache": True}
        load_model_with_report(file, format_options=bundle)
        mapped, mapped_report = load_model_with_report(file, format_options=bundle)
        with torch.no_grad():
            mapped_logits = mapped(ids)
        mapped_saved = out / f"{i}-rank{rank}-mapped_logits.pt"
        torch.save(mapped_logits, mapped_saved)
        results[file]["mapped_logits"] = str(mapped_saved)
        results[file]["mapped_cache"] = mapped_report.quantization["packed_cache"]
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
    exit_rank(0)
