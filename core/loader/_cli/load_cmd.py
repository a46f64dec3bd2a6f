"""``loader load`` and ``loader generate``: load for real and report, or talk to the model."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .._generation import generate_greedy, tokenizer_for
from .._pipeline.load import load_model_with_report
from ..errors import UnsupportedError
from .layer_kernels import kernel_summary_lines
from .output import format_bytes, print_json

if TYPE_CHECKING:
    from .._generation import GenerationResult

__all__ = ["generation_json", "parse_format_options", "run_generate", "run_load"]


def parse_format_options(pairs: list[str]) -> dict[str, str]:
    """``["concurrency=16", ...]`` from ``--format-option`` into a dict; the format plugin validates the values."""

    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UnsupportedError(f"--format-option expects KEY=VALUE, found {pair!r}")
        options[key.strip()] = value.strip()
    return options


def _load(args: argparse.Namespace):  # type: ignore[no-untyped-def]

    return load_model_with_report(
        args.source, dtype=args.dtype, device=args.device, load_format=args.load_format,
        quantization=args.quantization, revision=args.revision, model_impl=args.model_impl,
        format_options=parse_format_options(args.format_options),
        enable_expert_parallel=args.enable_expert_parallel, trust_remote_code=args.trust_remote_code,
        progress=sys.stderr.isatty() and not args.json,
    )


def run_load(args: argparse.Namespace) -> int:
    _, report = _load(args)
    if args.json:
        print_json(report.to_json())
        return 0
    print(f"loaded {report.architecture} from {report.source} ({report.load_format}, {len(report.files)} files)")
    if report.fallback_reason:
        print(f"  model impl     {report.model_impl} fallback ({report.fallback_reason})")
    print(f"  tensors        {report.tensors}")
    print(f"  parameters     {format_bytes(report.parameter_bytes)} as {report.dtype} on {report.device}")
    if report.quantization:
        settings = {k: v for k, v in report.quantization.items() if k not in ("layers", "kernels")}
        print(f"  quantization   {settings}")
        layers = report.quantization.get("layers")
        if isinstance(layers, dict) and layers:
            summary = kernel_summary_lines(layers)
            print(f"  kernels        {summary[0]}")
            for line in summary[1:]:
                print(f"                   {line}")
    if report.tp_size > 1:
        print(f"  tensor parallel rank {report.tp_rank} of {report.tp_size}")
    print(f"  read           {format_bytes(report.bytes_read)} of {format_bytes(report.checkpoint_bytes)}")
    if report.bytes_mapped:
        print(f"  mapped         {format_bytes(report.bytes_mapped)} (page cache pages, not copied)")
    print(f"  seconds        {report.seconds:.3f}  ({report.gb_per_second:.2f} GB/s)")
    print(f"  peak RSS       {format_bytes(report.peak_rss_bytes)}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    model, report = _load(args)
    bundle = tokenizer_for(args.source, load_format=args.load_format, revision=args.revision)
    result = generate_greedy(model, bundle, args.prompt, max_new_tokens=args.max_new_tokens, chat=args.chat,
                             system=args.system)
    if args.json:
        print_json(generation_json(result, report.to_json()))
        return 0
    print(result.text.strip())
    return 0


def generation_json(result: GenerationResult, load: dict[str, Any]) -> dict[str, Any]:
    """``loader generate --json``: the text, token counts and the two phases' timings, then the load report.

    The decode rate counts only the tokens after the first (each one narrow forward), so it compares with
    llama.cpp's "eval" rate; the prefill (the prompt's forward, which chose the first token) is reported in
    seconds. ``threads`` is torch's intra-op thread count the forwards ran with.
    """
    import torch

    decode_rate = result.decode_tokens_per_second
    return {
        "text": result.text,
        "prompt_tokens": len(result.prompt_ids),
        "generated_tokens": len(result.output_ids),
        "output_ids": list(result.output_ids),
        "prefill_seconds": round(result.prefill_seconds, 6),
        "decode_seconds": round(result.decode_seconds, 6),
        "decode_tokens_per_second": None if decode_rate is None else round(decode_rate, 2),
        "tokens_per_second": round(result.tokens_per_second, 2),
        "threads": torch.get_num_threads(),
        "load": load,
    }
