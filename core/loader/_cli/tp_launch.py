"""``loader load --tensor-parallel-size N``: start the N workers with torchrun's launcher, for the user.

The parent runs ``python -m torch.distributed.run --standalone --nproc-per-node N
-m loader._cli.main <the same arguments>``: torchrun's own launcher (rendezvous,
``RANK``/``WORLD_SIZE``/``MASTER_PORT`` per worker, one failure stopping the
rest), not a process group of ours. Each worker sees ``WORLD_SIZE == N`` and
loads its shard as under a hand-written torchrun line. Rank 0 prints the
report; the other ranks' stdout is dropped, so ``--json`` still prints one
object. The launcher's stderr (its own log records, a failed worker's summary)
is read back and only the workers' ``error:``/``warning:`` lines are passed on,
once each, so a bad input is still one line and exit code 2; ``--debug``
passes everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from .._settings import TP_LAUNCHED
from ..errors import ConfigError
from .parser import EXIT_USER_ERROR

__all__ = ["LAUNCHED_ENV", "launch_needed", "launch_workers", "quiet_other_ranks", "worker_exit"]

LAUNCHED_ENV = TP_LAUNCHED.name


def launch_needed(size: int, environ: dict[str, str] | None = None) -> bool:
    """Whether this process must start ``size`` workers (it is not one of them already).

    Under torchrun (``WORLD_SIZE`` set) nothing is launched: the default size 1 means "the world's size", and
    any other size must match it.
    """
    env = os.environ if environ is None else environ
    world = env.get("WORLD_SIZE")
    if world is None:
        return size > 1
    if size not in (1, int(world) if world.strip().isdigit() else -1):
        raise ConfigError(f"--tensor-parallel-size {size} under torchrun with WORLD_SIZE={world}: run the command "
                          "without torchrun to let loader launch the workers, or make the two agree")
    return False


def launch_workers(size: int, argv: Sequence[str]) -> int:
    """Run the same command in ``size`` torchrun workers; their stdout passes through, their errors once each."""
    debug = "--debug" in argv
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={size}",
               "-m", "loader._cli.main", *argv]
    env = {**os.environ, LAUNCHED_ENV: "1"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // size)))
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stderr=None if debug else subprocess.PIPE,
                          text=True, check=False)
    if debug:
        return done.returncode
    seen: list[str] = []
    for line in (done.stderr or "").splitlines():
        if line.startswith(("error: ", "warning: ")) and line not in seen:
            seen.append(line)
            sys.stderr.write(line + "\n")
    if done.returncode == 0:
        return 0
    if any(line.startswith("error: ") for line in seen) or "--json" in argv:
        return EXIT_USER_ERROR
    tail = " ".join((done.stderr or "").strip().splitlines()[-3:])[-500:]
    sys.stderr.write(f"error: the {size} tensor-parallel workers failed (exit status {done.returncode}): {tail}\n")
    return done.returncode


def quiet_other_ranks() -> None:
    """In a launched worker of rank > 0, drop stdout: rank 0 reports for all."""
    if TP_LAUNCHED.read() and os.environ.get("RANK", "0") != "0":
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of this process's life


def worker_exit(code: int) -> int:
    """A launched worker leaves with ``os._exit`` once its output is flushed and its group destroyed.

    gloo's threads now and then abort a finishing interpreter (``terminate called without an active
    exception``, pytorch/pytorch#179291; more often under load), which the launcher would report as a
    failed worker after a successful load. Anything else returns ``code``.
    """
    if not TP_LAUNCHED.read():
        return code
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
