"""Processes that start a load at the same instant, or die at a chosen point of writing a cache entry.

Why a fork server: eight fresh interpreters importing torch take longer than the loads they race, and
forking the test process itself copies whatever threads and cached state earlier tests left in it. The
server (:data:`CONTEXT`) imports torch, loader and the GGUF plugin once, single-threaded, and forks every
worker from that clean state: each worker is a first load, with nothing built or cached in memory.

Races are forced, never slept for: every worker sets its environment, then waits on one
:class:`multiprocessing.Barrier` and starts its task when the last one arrives. A *fault* (a name from
:data:`FAULTS`) is installed in a worker before the barrier; the writer-killing faults stop the process
with ``SIGKILL`` right after a temporary file was partly written, which is what a crash, the OOM killer or
a power cut leaves behind.

Each worker writes what it saw (a JSON object) to a file of its own; a worker that died leaves none.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import attrs
import torch

import loader
from loader._registry import ModelRegistry
from loader._registry import cache as probe_cache
from loader.kernels import bundle_file

__all__ = ["CONTEXT", "FAULTS", "TASKS", "Outcome", "gguf_load", "probe_info", "run_at_once", "state_digest"]

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "loader", "loader._registry.probe", "loader._registry.cache",
                                "loader_plugin_gguf.packed.config", "tests.reliability.cache_race"])
_JOIN_TIMEOUT_S = 50.0


@attrs.frozen
class Outcome:
    """One worker: its exit code (negative: the signal that killed it) and what it reported (``None`` if it
    died before reporting)."""

    exitcode: int | None
    result: dict[str, Any] | None


def run_at_once(task: str, count: int, env: Mapping[str, str], args: Sequence[Any] = (),
                fault: str | None = None) -> list[Outcome]:
    """Start ``count`` workers running ``task`` (a name from :data:`TASKS`) with ``args``, released together.

    :param env: set in each worker before the barrier (the fork server's own environment is the one it
        started with, not the test's).
    :param fault: installed in each worker before the barrier (:data:`FAULTS`).
    """
    with tempfile.TemporaryDirectory(prefix="cache-race-") as folder:
        reports = [Path(folder) / f"{i}.json" for i in range(count)]
        barrier = CONTEXT.Barrier(count)
        workers = [CONTEXT.Process(target=_worker, args=(task, fault, barrier, str(report), dict(env), tuple(args)))
                   for report in reports]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(_JOIN_TIMEOUT_S)
            if worker.exitcode is None:
                worker.kill()
                worker.join()
                raise AssertionError(f"a {task} worker did not finish within {_JOIN_TIMEOUT_S:g} s")
        return [Outcome(worker.exitcode, json.loads(report.read_text()) if report.exists() else None)
                for worker, report in zip(workers, reports, strict=True)]


def _worker(task: str, fault: str | None, barrier: Any, report: str, env: dict[str, str],
            args: tuple[Any, ...]) -> None:
    os.environ.update(env)
    if fault is not None:
        FAULTS[fault]()
    barrier.wait(timeout=_JOIN_TIMEOUT_S)
    try:
        result = TASKS[task](*args)
    except BaseException:  # any failure is the report
        result = {"error": traceback.format_exc()}
    Path(report).write_text(json.dumps(result))


# --- tasks ----------------------------------------------------------------------------------------------


def state_digest(model: Any) -> str:
    """A digest of every tensor of ``model``'s state dict: name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def gguf_load(path: str) -> dict[str, Any]:
    """Load the GGUF file at ``path`` packed; its weights' digest and the report's quantization record."""
    model, report = loader.load_model_with_report(path, quantization="gguf")
    quantization = {k: v for k, v in (report.quantization or {}).items() if k != "layers"}
    return {"digest": state_digest(model), "quantization": quantization}


def probe_info(root: str, package: str, architecture: str) -> dict[str, Any]:
    """Ask a fresh registry for ``architecture``'s info (class ``<package>.model:ToyForCausalLM`` under
    ``root``): a probe child, then the probe cache."""
    sys.path.insert(0, root)
    registry = ModelRegistry()
    registry.register(architecture, f"{package}.model:ToyForCausalLM", plugin="toy")
    info = registry.model_info(architecture)
    return {"info": info.to_json(), "notes": list(registry.cache.notes)}


TASKS: dict[str, Callable[..., dict[str, Any]]] = {"gguf_load": gguf_load, "probe_info": probe_info}


# --- faults ---------------------------------------------------------------------------------------------


class _DiesMidWrite:
    """A file handle that writes half of the first chunk it is given, makes it durable, and dies."""

    def __init__(self, handle: IO[Any]) -> None:
        self._handle = handle

    def write(self, data: Any) -> int:
        self._handle.write(data[: max(1, len(data) // 2)])
        self._handle.flush()
        os.fsync(self._handle.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: the process was killed")


def _kill_in_atomic_writes(module: Any) -> None:
    real = module.replaced_atomically

    @contextmanager
    def dying(path: Path, **kwargs: Any) -> Iterator[Any]:
        with real(path, **kwargs) as handle:
            yield _DiesMidWrite(handle)

    module.replaced_atomically = dying


def _kill_probe_cache_writer() -> None:
    _kill_in_atomic_writes(probe_cache)


def _kill_bundle_writer() -> None:
    _kill_in_atomic_writes(bundle_file)


def _kill_native_builder() -> None:
    """After the compiler wrote the library into the build's scratch folder: cut it to half, then die before
    it is moved into place."""
    real = subprocess.run

    def compile_then_die(command: Any, *args: Any, **kwargs: Any) -> Any:
        done = real(command, *args, **kwargs)
        if isinstance(command, list) and "-o" in command:
            built = Path(command[command.index("-o") + 1])
            built.write_bytes(built.read_bytes()[: built.stat().st_size // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    subprocess.run = compile_then_die  # type: ignore[assignment]


FAULTS: dict[str, Callable[[], None]] = {
    "kill_probe_cache_writer": _kill_probe_cache_writer,
    "kill_bundle_writer": _kill_bundle_writer,
    "kill_native_builder": _kill_native_builder,
}
