"""The ``loader`` command: parse, dispatch, and turn user errors into one line.

Bad input (any :class:`~loader.errors.LoadError`, or bad arguments) prints one
``error: ...`` line on stderr and exits with code 2; a traceback is shown only
with ``--debug``. With ``--json`` the error is one JSON object on stdout
(``{"error": ..., "type": ..., "exit_code": 2}``), so a script reading stdout
gets JSON whether the command worked or not; the exit code is the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import LoadError
from .parser import CORE_COMMANDS, EXIT_USER_ERROR, CliParser, build_parser
from .tp_launch import quiet_other_ranks, worker_exit

__all__ = ["build_parser", "main"]

def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    plugin_command = getattr(args, "plugin_command", None)
    if plugin_command is not None:
        return int(plugin_command.run(args))
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
        from .tp_launch import launch_needed, launch_workers

        if launch_needed(args.tensor_parallel_size):
            return launch_workers(args.tensor_parallel_size, argv)
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
    _escape_unencodable_output()
    arguments = sys.argv[1:] if argv is None else list(argv)
    CliParser.json_errors = "--json" in arguments
    command = next((a for a in arguments if not a.startswith("-")), None)
    asks_help = command is None and ("-h" in arguments or "--help" in arguments)
    plugin_commands = (command is not None and command not in CORE_COMMANDS) or asks_help
    args = build_parser(plugin_commands=plugin_commands).parse_args(arguments)
    _configure_logging(args.debug)
    quiet_other_ranks()
    return worker_exit(_run(args, arguments))


def _run(args: argparse.Namespace, arguments: list[str]) -> int:
    try:
        return _dispatch(args, arguments)
    except LoadError as exc:
        if args.debug:
            raise
        return _report_error(" ".join(str(exc).split()), type(exc).__name__, EXIT_USER_ERROR,
                             as_json=getattr(args, "json", False))
    except KeyboardInterrupt:
        return _report_error("interrupted", "KeyboardInterrupt", 130, as_json=getattr(args, "json", False))


def _report_error(message: str, kind: str, code: int, *, as_json: bool) -> int:
    """One line: ``error: ...`` on stderr, or with ``--json`` one JSON object on stdout; returns ``code``."""
    if as_json:
        sys.stdout.write(json.dumps({"error": message, "type": kind, "exit_code": code}) + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
