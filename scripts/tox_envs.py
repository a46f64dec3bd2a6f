"""What each env of ``tox.ini`` runs: its pytest arguments, the plugins it installs and its third-party deps.

Read with the standard library (``configparser``), expanding the few substitutions ``tox.ini`` uses
(``{[section]key}``, ``{toxinidir}``, ``{/}``, ``{posargs}``), for ``scripts/test_places.py`` (which env
runs which test) and ``scripts/external_envs.py`` (what an external-library env's result depends on).
"""

from __future__ import annotations

import configparser
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ToxEnv", "env_list", "read_envs"]

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"\{\[([^\]]+)\]([A-Za-z0-9_]+)\}")
INSTALL = re.compile(r"^\{\[wheels\]install\}(.*)$")


@dataclass(frozen=True)
class ToxEnv:
    """One ``[testenv:NAME]``: the pytest command lines it runs, the plugins it installs, its deps, its text."""

    name: str
    pytest_commands: tuple[tuple[str, ...], ...]  # each: pytest's arguments, {posargs} left out
    plugins: tuple[str, ...]  # names given to scripts/install_wheels.py ("runai[test]" -> "runai"); ("*",) = --all
    deps: tuple[str, ...]
    labels: tuple[str, ...]
    text: str  # its section and [testenv]'s, expanded: what the env is


def _parser(root: Path, text: str | None = None) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string((root / "tox.ini").read_text(encoding="utf-8") if text is None else text)
    return parser


def _expand(parser: configparser.ConfigParser, value: str, depth: int = 0) -> str:
    if depth > 10:
        raise ValueError(f"tox.ini: substitutions nest too deep in {value!r}")

    def replace(match: re.Match[str]) -> str:
        if (match.group(1), match.group(2)) == ("wheels", "install"):
            return match.group(0)  # kept: it is how an env names the plugins it installs
        return _expand(parser, parser.get(match.group(1), match.group(2), fallback=""), depth + 1)

    value = REFERENCE.sub(replace, value.replace("\\\n", " "))
    return value.replace("{toxinidir}", ".").replace("{/}", "/")


def _value(parser: configparser.ConfigParser, env: str, key: str) -> str:
    section = f"testenv:{env}"
    raw = parser.get(section, key, fallback=None)
    if raw is None:
        raw = parser.get("testenv", key, fallback="")
    return _expand(parser, raw)


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def env_list(root: Path = ROOT) -> list[str]:
    parser = _parser(root)
    return [e.strip() for e in parser.get("tox", "env_list", fallback="").replace("\n", ",").split(",") if e.strip()]


def read_envs(root: Path = ROOT, text: str | None = None) -> dict[str, ToxEnv]:
    """Every ``[testenv:NAME]`` but the packaging env, by name, in file order (of ``text``, if given)."""
    parser = _parser(root, text)
    envs = {}
    for section in parser.sections():
        if not section.startswith("testenv:") or section.startswith("testenv:."):
            continue
        name = section.split(":", 1)[1]
        commands = []
        for line in _lines(_value(parser, name, "commands")):
            words = [w for w in shlex.split(line.replace("{posargs}", "")) if w]
            if words[:1] == ["pytest"] or words[:3] == ["python", "-m", "pytest"]:
                commands.append(tuple(words[1:] if words[0] == "pytest" else words[3:]))
        plugins: list[str] = []
        for line in _lines(_value(parser, name, "commands_pre")):
            match = INSTALL.match(line)
            if match:
                named = [w.split("[", 1)[0] for w in shlex.split(match.group(1))]
                plugins += ["*" if w == "--all" else w for w in named]
        text = "\n".join(f"{key} = {' | '.join(_lines(_value(parser, name, key)))}" for key in
                         ("deps", "setenv", "commands_pre", "commands"))
        envs[name] = ToxEnv(name=name, pytest_commands=tuple(commands), plugins=tuple(plugins),
                            deps=tuple(_lines(_value(parser, name, "deps"))),
                            labels=tuple(w for w in re.split(r"[\s,]+", _value(parser, name, "labels")) if w),
                            text=text)
    return envs
