"""The external-library envs: run each when what its result depends on changed, or when its last pass is old.

The tox envs labelled ``external`` (``marlin-gptqmodel``, ``marlin-autoawq``, ``marlin-compressed-tensors``,
outside ``env_list``) check the marlin plugin against checkpoints that GPTQModel, AutoAWQ and compressed-tensors
write themselves. They install heavy libraries and take minutes, and what they test changes rarely, so CI
runs one only when it is due. ``.ci/external-checked`` records, per env, the day it last passed and its inputs then:

- its section of ``tox.ini`` (deps, commands), as a hash;
- each plugin it installs (``plugins/<name>``), as a hash of the folder's files;
- each test file it runs, the ``tests/helpers`` modules those import (followed through their own imports)
  and the ``conftest.py`` files above them, as hashes;
- the lines of ``constraints.txt`` that pin its deps (``gptqmodel==7.6.0``), as they are.

An env is due when one input differs from its record, when it has no record, or when the record is more than
``MAX_AGE_DAYS`` old (the core, which every load goes through, is not an input: the age catches its drift).
Hashes are of the files in the working tree that git tracks or would track, so a record written from
uncommitted changes matches the commit that brings them.

    python scripts/external_envs.py status       # each env: due or not, and why
    python scripts/external_envs.py run          # run the due ones (CI: make external-due), record each pass
    python scripts/external_envs.py run --all    # run them all and record (make external; commit the record)
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tox_envs import ROOT, ToxEnv, read_envs

__all__ = ["MAX_AGE_DAYS", "RECORD", "due", "external_envs", "inputs", "main"]

RECORD = Path(".ci") / "external-checked"
LABEL = "external"
MAX_AGE_DAYS = 7
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def external_envs(root: Path = ROOT) -> dict[str, ToxEnv]:
    """The envs of ``tox.ini`` labelled ``external`` (``labels = external``; ``tox -m external`` runs them all)."""
    return {name: env for name, env in read_envs(root).items() if LABEL in env.labels}


def _files(root: Path, path: str) -> list[Path]:
    """The files under ``path`` that git tracks or would track (all files, without git)."""
    try:
        done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", path], cwd=root,
                              capture_output=True, text=True, check=True)
        names = [root / line for line in done.stdout.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        base = root / path
        names = [base] if base.is_file() else [p for p in base.rglob("*") if "__pycache__" not in p.parts]
    return sorted(p for p in names if p.is_file())


def _digest(root: Path, path: str) -> str:
    digest = hashlib.sha256()
    for file in _files(root, path):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _helpers_of(root: Path, test_file: Path, seen: set[Path]) -> None:
    """Add to ``seen`` the modules of the ``tests`` package that ``test_file`` imports, and theirs."""
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return
    for node in ast.walk(tree):
        modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        if isinstance(node, ast.ImportFrom) and node.module:
            modules += [f"{node.module}.{a.name}" for a in node.names]
        for module in modules:
            if not module.startswith("tests."):
                continue
            base = root / Path(*module.split("."))
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file() and candidate not in seen:
                    seen.add(candidate)
                    _helpers_of(root, candidate, seen)


def _test_inputs(root: Path, env: ToxEnv) -> list[str]:
    paths: set[Path] = set()
    for args in env.pytest_commands:
        for arg in args:
            if arg.startswith("-"):
                continue
            target = root / arg.split("::", 1)[0]
            files = [target] if target.is_file() else sorted(target.rglob("*.py")) if target.is_dir() else []
            for file in files:
                paths.add(file)
                _helpers_of(root, file, paths)
    for file in list(paths):
        for folder in file.relative_to(root).parents:
            conftest = root / folder / "conftest.py"
            if conftest.is_file():
                paths.add(conftest)
    return sorted(p.relative_to(root).as_posix() for p in paths)


def _pins(root: Path, env: ToxEnv) -> dict[str, str]:
    names = {_canonical(m.group(1)) for dep in env.deps if not dep.startswith("-")
             for m in [REQUIREMENT_NAME.match(dep)] if m}
    pins = {}
    for line in (root / "constraints.txt").read_text(encoding="utf-8").splitlines():
        match = REQUIREMENT_NAME.match(line)
        if match and not line.lstrip().startswith("#") and _canonical(match.group(1)) in names:
            pins[f"pin {_canonical(match.group(1))}"] = line.strip()
    return pins


def inputs(root: Path, env: ToxEnv) -> dict[str, str]:
    """What ``env``'s result depends on, each input by name with its hash (or, for a pin, its line)."""
    found = {f"tox.ini [testenv:{env.name}]": hashlib.sha256(env.text.encode()).hexdigest()[:16]}
    for plugin in sorted({p for p in env.plugins if p != "*"}):
        found[f"plugins/{plugin}"] = _digest(root, f"plugins/{plugin}")
    for path in _test_inputs(root, env):
        found[path] = _digest(root, path)
    found.update(_pins(root, env))
    return found


def _read_record(root: Path) -> dict[str, dict[str, object]]:
    path = root / RECORD
    if not path.is_file():
        return {}
    return {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if not k.startswith("_")}


def due(root: Path, name: str, env: ToxEnv, record: dict[str, dict[str, object]],
        today: datetime.date) -> str | None:
    """Why ``env`` must run now, or None when its record still stands."""
    entry = record.get(name)
    if not entry:
        return f"no record of a pass in {RECORD}"
    passed = datetime.date.fromisoformat(str(entry["passed"]))
    recorded = entry.get("inputs", {})
    assert isinstance(recorded, dict)
    current = inputs(root, env)
    changed = sorted(k for k in current.keys() | recorded.keys() if current.get(k) != recorded.get(k))
    if changed:
        return f"{', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} changed since it passed on {passed}"
    age = (today - passed).days
    if age > MAX_AGE_DAYS:
        return f"it last passed on {passed}, {age} days ago (more than {MAX_AGE_DAYS})"
    return None


def _write_record(root: Path, record: dict[str, dict[str, object]]) -> None:
    document = {"_about": "Each external-library tox env's last pass and its inputs then; written by "
                          "scripts/external_envs.py (make external); .ci/run runs an env when they differ "
                          f"or the pass is more than {MAX_AGE_DAYS} days old.",
                **dict(sorted(record.items()))}
    (root / RECORD).write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status", "run"])
    parser.add_argument("--all", action="store_true", help="run every external env, due or not")
    parser.add_argument("--tox", default=str(Path(sys.executable).parent / "tox"), help="the tox to run them with")
    args = parser.parse_args(argv)
    today = datetime.datetime.now(datetime.UTC).date()
    record = _read_record(root)
    envs = external_envs(root)
    reasons = {name: ("asked for (--all)" if args.all else None) or due(root, name, env, record, today)
               for name, env in envs.items()}
    for name, reason in reasons.items():
        entry = record.get(name, {})
        print(f"{name}: " + (f"due: {reason}" if reason else
                             f"not due: its inputs are as when it passed on {entry.get('passed')}"), flush=True)
    if args.command == "status":
        return 0
    failed = []
    for name, reason in reasons.items():
        if reason is None:
            continue
        current = inputs(root, envs[name])
        if subprocess.run([args.tox, "-e", name], cwd=root, check=False).returncode != 0:
            failed.append(name)
            continue
        record[name] = {"passed": today.isoformat(), "inputs": current}
        _write_record(root, record)
        print(f"{name}: passed; recorded in {RECORD} (commit it)", flush=True)
    if failed:
        sys.stderr.write(f"error: external envs failed: {', '.join(failed)}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
