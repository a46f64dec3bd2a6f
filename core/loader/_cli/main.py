"""The ``loader`` command: parse, dispatch, and turn user errors into one line.

Bad input (any :class:`~loader.errors.LoadError`, or bad arguments) prints one
``error: ...`` line on stderr and exits with code 2; a traceback is shown only
with ``--debug``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["build_parser", "main"]

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USER_ERROR)


def _positive_gigabytes(text: str) -> float:
    """``--max-part-gb``: a finite number above zero (``nan`` and ``inf`` parse as floats, and must not)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of GB, found {text!r}")
    return value


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="local folder or file, Hub id (org/name), s3:// prefix, or .gguf file")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16, float32 or auto")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--format", default="auto", help="auto (default), dummy, or a format plugin's name")
    p.add_argument("--quantization", default=None, help="quantize while loading with this method")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loader", description="Load LLM checkpoints into ready torch modules.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plugins", help="list installed plugins, their status and hooks")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("models", help="list registered architectures and their capabilities")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("inspect", help="describe a checkpoint without loading it")
    p.add_argument("source")
    p.add_argument("--format", default="auto")
    p.add_argument("--revision", default=None)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("load", help="load a checkpoint, verify it and report speed and memory")
    _add_load_args(p)
    p = sub.add_parser("generate", help="load a checkpoint and generate text greedily")
    _add_load_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p = sub.add_parser("save-sharded", help="write each tensor-parallel rank's state for fast reloads")
    p.add_argument("source")
    p.add_argument("out", help="output folder (created; must be empty)")
    p.add_argument("--tp", type=int, required=True, help="tensor parallel size to cut for")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--format", default="auto")
    p.add_argument("--revision", default=None)
    p.add_argument("--max-part-gb", type=_positive_gigabytes, default=5.0, help="largest part file (GB, default 5)")
    p.add_argument("--json", action="store_true")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "plugins":
        from .info import run_plugins

        return run_plugins(args)
    if args.command == "models":
        from .info import run_models

        return run_models(args)
    if args.command == "inspect":
        from .inspect_cmd import run_inspect

        return run_inspect(args)
    if args.command == "load":
        from .load_cmd import run_load

        return run_load(args)
    if args.command == "generate":
        from .load_cmd import run_generate

        return run_generate(args)
    if args.command == "save-sharded":
        from .save_sharded_cmd import run_save_sharded

        return run_save_sharded(args)
    raise AssertionError(args.command)


def _configure_logging(debug: bool) -> None:
    """Keep stderr for our one-line errors: libraries' log records and warnings show only with ``--debug``.

    (bitsandbytes, for one, logs a warning on import when an optional kernel package is missing.)
    """
    import logging

    root = logging.getLogger()
    if debug:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    elif not root.handlers:
        root.addHandler(logging.NullHandler())
        ours = logging.StreamHandler(sys.stderr)  # our own warnings (an architecture override) still show
        ours.setFormatter(logging.Formatter("warning: %(message)s"))
        ours.setLevel(logging.WARNING)
        logging.getLogger("loader").addHandler(ours)
    logging.captureWarnings(not debug)


def _escape_unencodable_output() -> None:
    """Print what the terminal cannot encode as escapes instead of failing on it.

    Names and paths come from checkpoints and file systems: a config's architecture can hold a lone surrogate
    (JSON allows ``"\\udc80"``) and a non-UTF-8 file name decodes to one, which a strict UTF-8 stdout refuses
    with ``UnicodeEncodeError`` halfway through a table or the one ``error:`` line.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loader`` console script."""
    from ..errors import LoadError

    _escape_unencodable_output()
    args = build_parser().parse_args(argv)
    _configure_logging(args.debug)
    try:
        return _dispatch(args)
    except LoadError as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split())
        sys.stderr.write(f"error: {message}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
