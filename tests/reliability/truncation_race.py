"""Loads racing a process that truncates and restores the checkpoint: none may die of a signal.

Reading a memory map past the end of its file is a ``SIGBUS``, which no
``try`` catches: the process dies. This harness writes a small bf16 Llama
(safetensors and ``.bin``), starts a *saboteur* process that cuts the weight
file in half and writes it back in place, over and over, and a *loader*
process that loads round-robin for the given time — converting (bf16 file
into float32) and not, with ``LOADER_MAP_WEIGHTS=0`` and ``1``. Each load must end in a model or a
:class:`~loader.errors.LoadError`; the loader process never touches a loaded
model (a mapped model whose file is cut afterwards still faults on access:
docs/reliability.md). A negative exit status of the loader is the signal
that killed it.

Run it alone: ``python -m tests.reliability.truncation_race race --seconds 30``
(``make soak``); ``test_truncation_race.py`` runs a 3-second version.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

__all__ = ["CONFIGS", "RaceResult", "main", "run_race", "write_race_checkpoint"]

CONFIGS: tuple[tuple[str, str, str], ...] = (
    # (weight format, dtype asked for, LOADER_MAP_WEIGHTS)
    ("safetensors", "float32", "0"),
    ("safetensors", "float32", "1"),
    ("safetensors", "bfloat16", "1"),
    ("safetensors", "bfloat16", "0"),
    ("pt", "float32", "0"),
    ("pt", "bfloat16", "1"),
)

_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8192, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
}
"""Embeddings of 4 MiB (a converting copy long enough for the saboteur to cut the file under it), tensors of
64 KiB+ mapped (``LOADER_MAP_MIN_BYTES`` is lowered), 10 MB in all, so a load takes tens of milliseconds."""


@attrs.frozen
class RaceResult:
    """The loader process: its exit status, how loads ended per configuration, what it was doing last."""

    returncode: int
    loads: dict[str, int]
    refused: dict[str, int]
    last_config: str
    stderr: str

    @property
    def killed_by_signal(self) -> bool:
        return self.returncode < 0


def write_race_checkpoint(folder: Path, weight_format: str) -> Path:
    """A bf16 Llama in ``folder``: ``model.safetensors`` or ``pytorch_model.bin``; returns the weight file."""
    import torch

    from tests.helpers.malformed import llama_tensors, write_config, write_safetensors

    write_config(folder, _CONFIG)
    tensors = llama_tensors(_CONFIG, dtype=torch.bfloat16)
    if weight_format == "pt":
        path = folder / "pytorch_model.bin"
        torch.save(tensors, path)
        return path
    path = folder / "model.safetensors"
    write_safetensors(path, tensors)
    return path


def _saboteur(paths: list[Path], stop: threading.Event) -> None:
    """Cut each of ``paths`` in half and write it back in place (same inode), until ``stop`` is set.

    Cut for 0.5-2 ms at a time (long enough to land inside a converting copy), whole for 1-10 ms (so
    some loads also finish and map their parameters); a fixed seed keeps runs comparable. The files are
    left whole.
    """
    originals = [path.read_bytes() for path in paths]
    timing = random.Random(16)
    handles = [path.open("r+b") for path in paths]
    try:
        while not stop.is_set():
            for fh, original in zip(handles, originals, strict=True):
                os.truncate(fh.fileno(), len(original) // 2)
            time.sleep(timing.uniform(0.0005, 0.002))
            for fh, original in zip(handles, originals, strict=True):
                cut = len(original) // 2
                os.pwrite(fh.fileno(), original[cut:], cut)
            time.sleep(timing.uniform(0.001, 0.010))
    finally:
        for fh in handles:
            fh.close()


def _loader(folders: dict[str, str], seconds: float, progress: int = 2) -> str:
    """Load round-robin over :data:`CONFIGS` for ``seconds``; the counts per configuration as JSON.

    Each configuration goes to the ``progress`` descriptor before its load, so a process killed by a
    signal says what it was doing.
    """
    import torch  # noqa: F401 - imported before the clock starts: a cold import takes seconds here

    import loader
    from loader.errors import LoadError

    os.write(progress, b"ready\n")
    loads: dict[str, int] = {}
    refused: dict[str, int] = {}
    end = time.monotonic() + seconds
    round_robin = itertools.cycle(CONFIGS)
    while time.monotonic() < end:
        weight_format, dtype, mapping = config = next(round_robin)
        name = "/".join(config)
        os.environ["LOADER_MAP_WEIGHTS"] = mapping
        os.write(progress, f"{name}\n".encode())
        try:
            model = loader.load_model(folders[weight_format], dtype=dtype)
            del model  # never touched: its mapped pages may already be cut away
            loads[name] = loads.get(name, 0) + 1
        except LoadError:
            refused[name] = refused.get(name, 0) + 1
    return json.dumps({"loads": loads, "refused": refused})


def run_race(seconds: float, *, fork: bool = False) -> RaceResult:
    """Load every configuration in turn for ``seconds`` in a child process while a thread cuts the files.

    The child is a fresh interpreter, or with ``fork`` a fork of this process (which must have torch
    imported and no thread of its own busy): it then skips the seconds a cold ``import torch`` takes.
    """
    with tempfile.TemporaryDirectory(prefix="loader-race-") as tmp:
        files = {kind: write_race_checkpoint(Path(tmp) / kind, kind) for kind in ("safetensors", "pt")}
        folders = {kind: str(path.parent) for kind, path in files.items()}
        env = {"LOADER_MAP_MIN_BYTES": str(64 << 10), "OMP_NUM_THREADS": "1"}
        stop = threading.Event()
        saboteur = threading.Thread(target=_saboteur, args=(list(files.values()), stop), daemon=True)
        try:
            finish = _forked_loader(folders, seconds, env) if fork else _fresh_loader(folders, seconds, env)
            saboteur.start()
            returncode, stdout, stderr = finish()
        finally:
            stop.set()
            if saboteur.is_alive():
                saboteur.join()
    lines = stdout.strip().splitlines()
    counts = json.loads(lines[-1]) if returncode == 0 and lines else {}
    progress = [line for line in stderr.splitlines() if line.count("/") == 2 and " " not in line]
    return RaceResult(returncode, counts.get("loads", {}), counts.get("refused", {}),
                      progress[-1] if progress else "", stderr[-2000:])


_Finish = Callable[[], tuple[int, str, str]]


def _fresh_loader(folders: dict[str, str], seconds: float, env: dict[str, str]) -> _Finish:
    """Start the loader in a new interpreter; return once it has imported torch (its first line)."""
    command = [sys.executable, "-m", "tests.reliability.truncation_race", "loader", json.dumps(folders),
               str(seconds)]
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    ready = process.stderr.readline()

    def finish() -> tuple[int, str, str]:
        try:
            stdout, stderr = process.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        return process.returncode, stdout, ready + stderr

    return finish


def _forked_loader(folders: dict[str, str], seconds: float, env: dict[str, str]) -> _Finish:
    """Fork the loader off this process; its progress and result come back through pipes."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: load, report, and leave without running the parent's cleanup
        code = 1
        try:
            os.close(out_read)
            os.close(err_read)
            os.environ.update(env)
            os.write(out_write, (_loader(folders, seconds, err_write) + "\n").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(out_write)
    os.close(err_write)

    def finish() -> tuple[int, str, str]:
        with os.fdopen(out_read) as out, os.fdopen(err_read) as err:
            stdout, stderr = out.read(), err.read()
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), stdout, stderr

    return finish


def main(argv: list[str] | None = None) -> int:
    """``race --seconds N`` (report; exit 1 if the loader died of a signal), or the loader child's role."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    race = sub.add_parser("race")
    race.add_argument("--seconds", type=float, default=30.0)
    child = sub.add_parser("loader")
    child.add_argument("folders", help="JSON: weight format -> checkpoint folder")
    child.add_argument("seconds", type=float)
    args = parser.parse_args(argv)
    if args.role == "loader":
        print(_loader(json.loads(args.folders), args.seconds))
        return 0
    result = run_race(args.seconds)
    for config in CONFIGS:
        name = "/".join(config)
        print(f"{name:24} loads {result.loads.get(name, 0):5}  refused (LoadError) {result.refused.get(name, 0):5}")
    if result.killed_by_signal:
        print(f"the loader was killed by signal {-result.returncode} during a {result.last_config} load")
    elif result.returncode:
        print(f"the loader failed (exit {result.returncode}):\n{result.stderr}")
    else:
        print("no process was killed by a signal")
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
