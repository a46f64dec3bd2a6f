"""``loader inspect SOURCE``: what a checkpoint holds, without loading it.

Tensors are listed from the format's lazy stream, so nothing but headers is read:
local files are opened and their headers parsed; ``s3://`` objects and the shards
of a Hub safetensors repository are read with ranged requests (the options say
``headers_only``, so their streams yield header-only handles).
``--layers`` adds each layer's planned kernel: the model is built on the ``meta``
device and each layer's quantize method answers from shapes alone
(``loader._pipeline.plan``).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from .. import _hooks
from .._options import LoadOptions, check_model_impl
from .._pipeline.plan import plan_layers
from .._pipeline.prepare import prepare_checkpoint
from .._registry import get_registry
from ..errors import UnknownArchitectureError
from ..weights import ReadStats
from .layer_kernels import kernel_summary_lines, print_layer_table
from .output import format_bytes, print_json, print_table

__all__ = ["inspect_source", "run_inspect"]


def inspect_source(location: str, load_format: str = "auto", revision: str | None = None,
                   model_impl: str = "auto") -> dict[str, Any]:
    """The facts ``loader inspect`` prints, as a JSON-friendly dict."""
    import torch

    check_model_impl(model_impl)
    # headers_only: a remote format (s3://, a Hub id) lists tensors from headers instead of fetching them
    options = LoadOptions(dtype=torch.float32, device=torch.device("cpu"), load_format=load_format,
                          revision=revision, headers_only=True)
    prepared = prepare_checkpoint(location, options)
    archs = prepared.architectures
    registry = get_registry()
    try:
        choice = registry.choose(archs, model_impl)
    except UnknownArchitectureError:
        choice = None
    declared = prepared.hf_config.get("quantization_config")
    quant = dict(declared) if isinstance(declared, dict) else None
    stats = ReadStats()
    counts: Counter[str] = Counter()
    bytes_by_dtype: Counter[str] = Counter()
    total = 0
    tensors = 0
    for _, tensor in _hooks.iter_weights(prepared.source, prepared.weight_format, options, stats):
        label = tensor.stored_type
        counts[label] += 1
        bytes_by_dtype[label] += tensor.nbytes
        total += tensor.nbytes
        tensors += 1
    return {
        "source": prepared.source.display(),
        "format": prepared.weight_format.name,
        "architectures": archs,
        "architecture": choice.architecture if choice else None,
        "plugin": choice.entry.plugin if choice else None,
        "model_impl": choice.model_impl if choice else None,
        "fallback_reason": choice.fallback_reason if choice else None,
        "quantization": quant,
        "files": list(prepared.weight_format.files),
        "tensors": tensors,
        "bytes": total,
        "dtypes": {k: {"tensors": counts[k], "bytes": bytes_by_dtype[k]} for k in sorted(counts)},
    }


def run_inspect(args: argparse.Namespace) -> int:
    info = inspect_source(args.source, args.load_format, args.revision, args.model_impl)
    if args.layers:
        plan = plan_layers(args.source, device=args.device, load_format=args.load_format,
                           quantization=args.quantization, revision=args.revision, model_impl=args.model_impl,
                           trust_remote_code=args.trust_remote_code)
        info["layers"] = plan["layers"]
        info["layers_device"] = args.device
    if args.json:
        print_json(info)
        return 0
    print(f"source        {info['source']}")
    print(f"format        {info['format']}")
    arch = info["architecture"] or f"none installed for {', '.join(info['architectures'])}"
    print(f"architecture  {arch}" + (f"  (plugin {info['plugin']})" if info["plugin"] else ""))
    if info["fallback_reason"]:
        print(f"model impl    {info['model_impl']} fallback ({info['fallback_reason']})")
    print(f"quantization  {info['quantization'].get('quant_method') if info['quantization'] else 'none'}")
    print(f"files         {len(info['files'])}")
    print(f"tensors       {info['tensors']}  ({format_bytes(info['bytes'])})")
    print()
    print_table(["dtype", "tensors", "bytes"],
                [[k, v["tensors"], format_bytes(v["bytes"])] for k, v in info["dtypes"].items()])
    if args.layers:
        summary = kernel_summary_lines(info["layers"])
        print()
        print(f"kernels on {args.device} (planned from shapes; no weights read): {summary[0]}")
        for line in summary[1:]:
            print(f"  {line}")
        print()
        print_layer_table(info["layers"])
    return 0
