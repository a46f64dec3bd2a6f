"""``loader save-tensorized SOURCE OUT [-tp N] [--encrypt KEYFILE]``: write per-rank ``.tensors`` files once.

Added to the ``loader`` command line through ``loader_cli_commands``; this
module imports only argparse and json, the writer when the command runs.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["SaveTensorizedCommand"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, found {text!r}")
    return key, value


class SaveTensorizedCommand:
    """The ``save-tensorized`` subcommand."""

    name = "save-tensorized"
    help = "write each tensor-parallel rank's parameters as a tensorizer .tensors file (local or s3://)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("source", help="the checkpoint to convert (any source loader reads)")
        parser.add_argument("out", help="output folder or s3://bucket/prefix (created; must be empty)")
        parser.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=_positive_int, default=1, metavar="N",
                            help="tensor parallel size to cut for: one model-rank-NNN.tensors per rank (default 1)")
        parser.add_argument("--encrypt", default=None, metavar="KEYFILE",
                            help="encrypt every file with the 32-byte key in KEYFILE (created with a random key "
                                 "when missing; keep it: loading needs --format-option encryption_keyfile=KEYFILE)")
        parser.add_argument("--dtype", default="bfloat16", choices=("auto", "bfloat16", "float16", "float32"),
                            help="dtype of the saved parameters (default bfloat16; auto: the checkpoint's)")
        parser.add_argument("--load-format", "--format", dest="load_format", default="auto", metavar="FORMAT",
                            help="the source's weight format (default: detect)")
        parser.add_argument("--format-option", dest="format_options", action="append", default=[], type=_key_value,
                            metavar="KEY=VALUE", help="an option for the source's format (repeatable); the s3_* "
                                                      "options also set the endpoint and keys of an s3:// OUT")
        parser.add_argument("--revision", default=None, help="Hub revision: branch, tag or commit (default: main)")
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object; errors too")

    def run(self, args: argparse.Namespace) -> int:
        from .save import save_tensorized

        saved = save_tensorized(args.source, args.out, tp_size=args.tp, dtype=args.dtype,
                                load_format=args.load_format, encrypt=args.encrypt,
                                format_options=dict(args.format_options), revision=args.revision)
        if args.json:
            print(json.dumps({"folder": saved.folder, "tp_size": saved.tp_size, "files": list(saved.files),
                              "bytes_written": saved.bytes_written, "encrypted": saved.encrypted}))
            return 0
        print(f"wrote {len(saved.files)} file(s) ({saved.bytes_written / 1e6:.1f} MB of tensors"
              f"{', encrypted' if saved.encrypted else ''}) for tp={saved.tp_size} to {saved.folder}")
        key = f" --format-option encryption_keyfile={args.encrypt}" if saved.encrypted else ""
        print(f"load with: loader load {saved.folder} -tp {saved.tp_size}{key}")
        return 0
