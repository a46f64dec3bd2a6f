"""``docs/cli.md``: the CLI reference, rendered from the ``loader`` command's own argparse parser.

The page's prose (what each command prints, how it behaves) is written by hand
in ``docs/_templates/cli.md``; each ``{{ options: COMMAND }}`` line there is
replaced by that command's synopsis and a table of its arguments (flags,
aliases, value names, defaults, choices and help text) read from the parser, and
``{{ commands }}`` by the list of commands. So a flag added to the parser
appears in the docs by regenerating them, and a command with no place in the
template is an error rather than a silent omission.
"""

from __future__ import annotations

import argparse
import re

import attrs

PLACEHOLDER = re.compile(r"^\{\{ (options: (?P<command>[\w-]+)|commands) \}\}$", re.M)
GLOBAL = "loader"
"""The placeholder name of the top-level options (``{{ options: loader }}``)."""


@attrs.frozen
class CliCommand:
    """One command (or, named ``loader``, the top level) and what it accepts."""

    name: str
    help: str
    parser: argparse.ArgumentParser

    @property
    def arguments(self) -> list[argparse.Action]:
        """Its positionals and options, as declared; argparse's own ``-h`` and the subcommand slot left out."""
        return [a for a in self.parser._actions
                if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]

    @property
    def flags(self) -> list[str]:
        """Every option string, aliases included (``--load-format``, ``--format``)."""
        return [flag for action in self.arguments for flag in action.option_strings]


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if len(found) != 1:
        raise ValueError(f"expected one subcommand group in the {parser.prog!r} parser, found {len(found)}")
    return found[0]


def cli_commands(parser: argparse.ArgumentParser) -> list[CliCommand]:
    """The top level (named ``loader``) and then every subcommand, in the parser's order."""
    sub = _subcommands(parser)
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    commands = [CliCommand(GLOBAL, parser.description or "", parser)]
    commands += [CliCommand(name, helps.get(name, ""), p) for name, p in sub.choices.items()]
    return commands


def command_heading_prefix(name: str) -> str:
    """How a command's section heading starts (``## `loader load``); the coverage check finds sections by it."""
    return f"## `loader {name}"


def _value_name(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None and not action.option_strings:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _synopsis_part(action: argparse.Action) -> str:
    if not action.option_strings:
        return _value_name(action)
    text = action.option_strings[0] + (f" {_value_name(action)}" if _takes_value(action) else "")
    if isinstance(action, argparse._AppendAction):
        text += " ..."
    return text if action.required else f"[{text}]"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse expands %(default)s and friends in help; so do we
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        text = text % dict(params, prog=prog)
    return text


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if not _takes_value(action) or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def render_options(command: CliCommand) -> str:
    """The synopsis line and the arguments table of one command."""
    words = ["loader"] if command.name == GLOBAL else ["loader", command.name]
    synopsis = " ".join([*words, *(_synopsis_part(a) for a in command.arguments)])
    if command.name == GLOBAL:
        synopsis += " COMMAND ..."
    rows = []
    for action in command.arguments:
        if action.option_strings:
            value = f" {_value_name(action)}" if _takes_value(action) else ""
            names = ", ".join(f"`{flag}{value}`" if i == 0 else f"`{flag}`"
                              for i, flag in enumerate(action.option_strings))
        else:
            names = f"`{_value_name(action)}`"
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices and action.option_strings else ""
        rows.append((names, _default(action), choices, _cell(_help(action, command.parser.prog))))
    # a column no argument of this command fills (no defaults, no choices) is left out
    keep = [i for i in range(4) if i in (0, 3) or any(row[i] for row in rows)]
    header = [("argument", "default", "choices", "meaning")[i] for i in keep]
    lines = ["```text", synopsis, "```", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows]
    return "\n".join(lines)


def render_command_list(commands: list[CliCommand]) -> str:
    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| `loader {c.name}` | {_cell(c.help)} |" for c in commands if c.name != GLOBAL]
    return "\n".join(lines)


def render_cli(parser: argparse.ArgumentParser, template: str) -> str:
    """The page: ``template`` with each placeholder replaced; every command must have exactly one."""
    commands = {c.name: c for c in cli_commands(parser)}
    placed = [m.group("command") for m in PLACEHOLDER.finditer(template) if m.group("command")]
    problems = [f"{{{{ options: {name} }}}} names no command" for name in placed if name not in commands]
    problems += [f"command {name!r} has no {{{{ options: {name} }}}} line" for name in commands if name not in placed]
    problems += [f"{{{{ options: {name} }}}} appears {placed.count(name)} times"
                 for name in sorted(set(placed)) if placed.count(name) > 1]
    if problems:
        raise ValueError("docs/_templates/cli.md: " + "; ".join(problems))

    def expand(m: re.Match[str]) -> str:
        name = m.group("command")
        return render_options(commands[name]) if name else render_command_list(list(commands.values()))

    return PLACEHOLDER.sub(expand, template)
