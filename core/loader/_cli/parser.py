"""The ``loader`` command line: every command, option, choice and help text, in vLLM's spelling.

Options a vLLM user already knows keep vLLM's names (``--load-format``,
``--dtype auto``, ``--tensor-parallel-size``); the old ``--format`` stays as an
alias. Bad arguments print one ``error:`` line (or, with ``--json``, one JSON
object on stdout) and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, NoReturn

from .._known_plugins import installed_uri_schemes
from .._options import MODEL_IMPLS
from ..errors import PluginError
from .versions import VersionAction

__all__ = ["CORE_COMMANDS", "DTYPE_CHOICES", "EXIT_USER_ERROR", "CliParser", "build_parser", "source_help"]

EXIT_USER_ERROR = 2
CORE_COMMANDS = ("plugins", "models", "inspect", "load", "generate", "save-sharded")
"""The core's own subcommands: parsing one of them loads no plugin (plugins add theirs through
``loader_cli_commands``)."""
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
FORMAT_HELP = ("weight format: auto (default: detect; safetensors before .bin), dummy (random weights), "
               "sharded_state (save-sharded output), or a format plugin's name "
               "(safetensors, pt, gguf, runai_streamer, ...)")


class CliParser(argparse.ArgumentParser):
    json_errors = False  # set by main when --json is on the command line: errors go to stdout as JSON

    def error(self, message: str) -> NoReturn:
        if CliParser.json_errors:
            sys.stdout.write(json.dumps({"error": message, "type": "UsageError",
                                         "exit_code": EXIT_USER_ERROR}) + "\n")
        else:
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return value


def source_help() -> str:
    """What SOURCE may be; URI schemes only as installed plugins provide them (read from entry point names)."""

    schemes = installed_uri_schemes()
    uris = f", a URI ({', '.join(f'{s}://' for s in schemes)})" if schemes else ""
    return f"local folder or file (.gguf, .safetensors), Hub id (org/name){uris}"


def _add_source(p: argparse.ArgumentParser, source_text: str) -> None:
    p.add_argument("source", help=source_text)
    p.add_argument("--load-format", "--format", dest="load_format", default="auto", metavar="FORMAT",
                   help=FORMAT_HELP)
    p.add_argument("--revision", default=None, help="Hub revision: branch, tag or commit (default: main)")


def _add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object; errors too")


def _add_model_impl(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-impl", default="auto", dest="model_impl", choices=MODEL_IMPLS,
                   help="auto (default: a native class, else the transformers fallback), native (never the "
                        "fallback) or transformers (always the fallback), as vLLM's --model-impl")


def _add_trust_remote_code(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let a checkpoint that ships its own modeling code (auto_map in config.json) run it, as "
                        "in vLLM and transformers; without it such a checkpoint is refused and none of its files "
                        "runs")


def _add_load_args(p: argparse.ArgumentParser, source_text: str) -> None:
    _add_source(p, source_text)
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="parameter dtype; auto (default) uses the checkpoint's torch_dtype, else bfloat16 (GGUF: "
                        "float32 activations with Q4_0/Q4_1/Q4_K weights kept packed on the CPU); float32 "
                        "dequantizes every GGUF weight")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--quantization", "-q", default=None, metavar="METHOD",
                   help="quantization method to load with (default: what config.json declares); e.g. "
                        "bitsandbytes, or a quantization plugin's method")
    p.add_argument("--format-option", dest="format_options", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for the format plugin (repeatable), e.g. concurrency=16 for runai_streamer; "
                        "dequantize=true, kernel_dtype=float32 or packed_cache=false for gguf")
    _add_model_impl(p)
    _add_trust_remote_code(p)
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="with tensor parallelism: place whole experts of a mixture-of-experts model on ranks "
                        "(expert parallel size = tensor parallel size) instead of splitting every expert, as "
                        "vLLM's --enable-expert-parallel")
    _add_json(p)


def _add_plugin_commands(sub: Any) -> None:
    """Each installed plugin's subcommands (``loader_cli_commands``), after the core's."""
    from .._hooks import cli_commands

    for command in cli_commands():
        if command.name in CORE_COMMANDS:
            raise PluginError(f"a plugin's command {command.name!r} has the name of a core command")
        p = sub.add_parser(command.name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(plugin_command=command)


def build_parser(source_text: str | None = None, *, plugin_commands: bool = True) -> argparse.ArgumentParser:
    """The whole command line; ``source_text`` replaces SOURCE's help (the docs name every plugin's schemes);
    ``plugin_commands`` adds the plugins' subcommands (which loads the plugins)."""
    if source_text is None:
        source_text = source_help()  # one scan of the installed entry points for every command's SOURCE help
    parser = CliParser(prog="loader", description="Load LLM checkpoints into ready torch modules.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and log records")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CliParser, metavar="COMMAND")

    p = sub.add_parser("plugins", help="list installed plugins, their status and hooks")
    _add_json(p, "the plugins")
    p = sub.add_parser("models", help="list registered architectures and their capabilities")
    _add_json(p, "the architectures")
    p = sub.add_parser("inspect", help="describe a checkpoint without loading it")
    _add_source(p, source_text)
    _add_model_impl(p)
    _add_trust_remote_code(p)
    p.add_argument("--layers", action="store_true",
                   help="also build the model on the meta device (no weights read) and show the kernel each "
                        "layer's quantization would choose, with the reason for each fallback")
    p.add_argument("--device", default="cpu",
                   help="with --layers: the device to plan for, cpu (default), cuda or cuda:N")
    p.add_argument("--quantization", "-q", default=None, metavar="METHOD",
                   help="with --layers: the quantization to plan with (default: what config.json declares)")
    _add_json(p)
    p = sub.add_parser("load", help="load a checkpoint, verify it and report speed and memory")
    _add_load_args(p, source_text)
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1, metavar="N",
                   help="load N tensor-parallel shards, one process each, launched with torchrun's launcher "
                        "(default 1; under torchrun already, N must equal its world size)")
    p = sub.add_parser("generate", help="load a checkpoint and generate text greedily")
    _add_load_args(p, source_text)
    p.add_argument("--prompt", required=True, help="text to continue (or the user message, with --chat)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=32, metavar="N",
                   help="tokens to generate at most (default 32)")
    p = sub.add_parser("save-sharded", help="write each tensor-parallel rank's state for fast reloads")
    _add_source(p, source_text)
    p.add_argument("out", help="output folder (created; must be empty)")
    p.add_argument("--tp", type=_positive_int, required=True, metavar="N", help="tensor parallel size to cut for")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES,
                   help="dtype of the saved parameters (default bfloat16; auto: the checkpoint's)")
    p.add_argument("--max-part-gb", type=_positive_gigabytes, default=5.0, metavar="GB",
                   help="largest part file (GB, default 5)")
    _add_json(p)
    if plugin_commands:
        _add_plugin_commands(sub)
    return parser
