"""Read model info without importing the model here: one child process for all of them.

Importing a model module may initialise CUDA (or crash, or hang); after that
a parent can no longer fork healthy workers. So the registry asks
``python -m loader._registry probe ...`` (same interpreter, CUDA hidden, the
parent's ``sys.path``) for every architecture it has not answered yet, in one
child, with a timeout. Anything but a clean JSON answer becomes a
:class:`~loader.errors.PluginError` naming the architectures, their plugins
and the tail of the child's stderr; the parent itself is never affected.

``LOADER_PROBE_IN_PROCESS=1`` opts out (imports here: for debugging, or
platforms where a child is costly); ``LOADER_PROBE_TIMEOUT`` sets the timeout
in seconds (default 120).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence

from .._settings import PROBE_IN_PROCESS, PROBE_TIMEOUT
from ..errors import PluginError
from .capabilities import ModelInfo, ModelInfoError, inspect_model_class
from .entry import RegisteredModel

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ProbeOutcome",
    "child_command",
    "child_environment",
    "probe_in_child",
    "probe_in_process",
    "probe_timeout",
    "wants_in_process_probe",
]

DEFAULT_TIMEOUT_S = PROBE_TIMEOUT.default
STDERR_TAIL_CHARS = 2000

ProbeOutcome = ModelInfo | PluginError
"""What probing one architecture gives: its info, or the error naming it."""


def probe_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds the child may run: ``LOADER_PROBE_TIMEOUT`` or 120 (bad: :class:`~loader.errors.SettingError`)."""
    return PROBE_TIMEOUT.read(environ)


def wants_in_process_probe(environ: Mapping[str, str] | None = None) -> bool:
    """``LOADER_PROBE_IN_PROCESS`` set to a yes value (1, true, yes, on)."""
    return PROBE_IN_PROCESS.read(environ)


def _describe(entries: Sequence[RegisteredModel]) -> str:
    return ", ".join(f"{e.architecture!r} ({e.class_path} from plugin {e.plugin!r})" for e in entries)


def probe_in_process(entry: RegisteredModel) -> ModelInfo:
    """Import the class here and inspect it (the class may already be imported)."""
    cls = entry.load_class()
    try:
        return inspect_model_class(entry.architecture, cls)
    except ModelInfoError as exc:
        raise PluginError(
            f"plugin {entry.plugin!r}: {entry.class_path} for architecture {entry.architecture!r}: {exc}"
        ) from exc


def child_command(entries: Sequence[RegisteredModel]) -> list[str]:
    """The probe child's argv: this interpreter running ``loader._registry``."""
    specs = [f"{e.architecture}={e.class_path}" for e in entries]
    return [sys.executable, "-m", "loader._registry", "probe", *specs]


def _extra_import_paths() -> list[str]:
    """Entries of ``sys.path`` a fresh interpreter would not have (tests, embedding apps, PYTHONPATH).

    The interpreter's own library and site-packages folders are left out: the
    child has them anyway, and listing them in ``PYTHONPATH`` would put
    site-packages before the standard library.
    """
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    defaults = {os.path.normcase(os.path.abspath(path)) for key in keys if (path := sysconfig.get_path(key))}
    extra: list[str] = []
    for entry in sys.path:
        full = os.path.abspath(entry) if entry else os.getcwd()
        norm = os.path.normcase(full)
        if any(norm == d or norm.startswith(d + os.sep) for d in defaults) or not os.path.exists(full):
            continue
        extra.append(full)
    return list(dict.fromkeys(extra))


def child_environment() -> dict[str, str]:
    """This process's environment with CUDA hidden and this process's extra import paths."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("LOADER_PROBE_IN_PROCESS", None)
    env["PYTHONPATH"] = os.pathsep.join(_extra_import_paths())
    return env


def _stderr_tail(stderr: str | bytes | None) -> str:
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    tail = (stderr or "").strip()[-STDERR_TAIL_CHARS:]
    return f"; stderr: ...{tail}" if tail else "; stderr was empty"


def probe_in_child(entries: Sequence[RegisteredModel],
                   packages: dict[str, list[str]] | None = None) -> dict[str, ProbeOutcome]:
    """Probe all ``entries`` in one child; every entry gets an info or a :class:`PluginError`.

    ``packages``, when given, receives each answered architecture's MRO packages (for the cache).
    """
    if not entries:
        return {}
    timeout = probe_timeout()
    command = child_command(entries)
    what = f"probing architectures {_describe(entries)} in a child process"
    try:
        done = subprocess.run(command, env=child_environment(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        failure = PluginError(
            f"{what} did not finish within {timeout:g} s (LOADER_PROBE_TIMEOUT){_stderr_tail(exc.stderr)}"
        )
        return _each_alone(entries, failure, packages)
    except OSError as exc:
        failure = PluginError(f"{what} could not start {command[0]}: {exc}")
        return {e.architecture: failure for e in entries}
    if done.returncode != 0:
        failure = PluginError(f"{what} failed with exit status {done.returncode}{_stderr_tail(done.stderr)}")
        return _each_alone(entries, failure, packages)
    return _read_answer(entries, done.stdout, done.stderr, what, packages)


def _each_alone(entries: Sequence[RegisteredModel], failure: PluginError,
                packages: dict[str, list[str]] | None) -> dict[str, ProbeOutcome]:
    """A child that crashed or hung took every entry with it: probe each alone, so only the culprit fails.

    Costs one child per entry, and a second timeout for a hanging one, only after a failure.
    """
    if len(entries) == 1:
        return {entries[0].architecture: failure}
    outcomes: dict[str, ProbeOutcome] = {}
    for entry in entries:
        outcomes.update(probe_in_child([entry], packages))
    return outcomes


def _read_answer(entries: Sequence[RegisteredModel], stdout: str, stderr: str,
                 what: str, packages: dict[str, list[str]] | None = None) -> dict[str, ProbeOutcome]:
    try:
        answer = json.loads(stdout)
        infos, errors = answer["infos"], answer["errors"]
        if not isinstance(infos, dict) or not isinstance(errors, dict):
            raise TypeError("infos and errors must be objects")
    except (ValueError, TypeError, KeyError) as exc:
        failure = PluginError(
            f"{what}: the child printed {stdout[:200]!r}, not the expected JSON "
            f"({type(exc).__name__}: {exc}){_stderr_tail(stderr)}"
        )
        return {e.architecture: failure for e in entries}
    outcomes: dict[str, ProbeOutcome] = {}
    for entry in entries:
        arch = entry.architecture
        prefix = f"plugin {entry.plugin!r}: {entry.class_path} for architecture {arch!r}"
        if arch in errors:
            outcomes[arch] = PluginError(f"{prefix} failed in the probe child: {errors[arch]}")
        elif arch in infos:
            try:
                info = ModelInfo.from_json(infos[arch])
                if info.architecture != arch:
                    raise ModelInfoError(f"answered for architecture {info.architecture!r}")
                outcomes[arch] = info
                listed = answer.get("packages", {}).get(arch) if isinstance(answer.get("packages"), dict) else None
                if packages is not None and isinstance(listed, list):
                    packages[arch] = [p for p in listed if isinstance(p, str)]
            except (ModelInfoError, TypeError) as exc:
                outcomes[arch] = PluginError(f"{prefix}: the probe child answered malformed info: {exc}")
        else:
            outcomes[arch] = PluginError(f"{prefix}: the probe child gave no answer{_stderr_tail(stderr)}")
    return outcomes
