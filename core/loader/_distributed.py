"""Tensor-parallel rank, world size and collectives over ``torch.distributed``.

The process group always comes from ``torchrun`` (``RANK``/``WORLD_SIZE``/
``MASTER_ADDR`` in the environment); loader never builds its own groups. The
collectives run over the tensor parallel group: torch's default group, or the
one a user named with :func:`loader.set_tensor_parallel_group`. At
a group size of 1 every collective is a no-op, so single-process code pays
nothing.

The rank and size a load builds for are the load session's
(:func:`loader._session.current_session`); outside a load they are this
process's place in the group. Tests (and tools that build one rank's shard of
a model without launching several processes) can pretend to be a given rank
with :func:`simulated_tp`, which opens a session with that rank and size:
layers built inside it size and narrow their parameters for that rank, while
collectives stay no-ops because no process group exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from ._process_group import group_rank, group_size, tensor_parallel_group
from ._session import current_session, load_session
from .errors import ConfigError, UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = [
    "all_gather",
    "all_reduce",
    "check_torchrun_environment",
    "divide",
    "group_rank",
    "group_size",
    "init_distributed",
    "simulated_tp",
]

def init_distributed(device: str | torch.device | None = None) -> None:
    """Join the process group ``torchrun`` describes, when there is more than one process.

    Idempotent: does nothing when ``WORLD_SIZE`` is unset or 1, or when the
    group already exists. The backend is NCCL when ``device`` is a CUDA device
    (and each process then uses ``cuda:LOCAL_RANK``), gloo otherwise.
    """
    world = _env_integer(os.environ, "WORLD_SIZE", minimum=1) if "WORLD_SIZE" in os.environ else 1
    if world <= 1:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise UnsupportedError(
            f"WORLD_SIZE={world} asks for tensor parallelism, but this torch build has no torch.distributed"
        )
    if dist.is_initialized():
        return
    check_torchrun_environment(os.environ, world)
    on_cuda = device is not None and torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if on_cuda else "gloo")


def _env_integer(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    raw = environ[name]
    try:
        value = int(raw.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"{name}={raw!r}: expected an integer of at least {minimum} (torchrun sets it)")
    return value


def check_torchrun_environment(environ: Mapping[str, str], world: int) -> None:
    """The variables ``torchrun`` sets beside ``WORLD_SIZE``, checked by name before joining a group.

    ``torch.distributed`` reports a missing or malformed one as a bare ``ValueError`` (or waits for a
    rendezvous that never comes); a process started by hand with ``WORLD_SIZE=2`` is a user's error.
    """
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if not environ.get(name, "").strip():
            raise ConfigError(f"WORLD_SIZE={world} but {name} is not set; launch with torchrun, which sets RANK, "
                              "LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each process")
        if name == "RANK" and (rank := _env_integer(environ, "RANK")) >= world:
            raise ConfigError(f"RANK={rank} is outside the {world} processes of WORLD_SIZE={world}")
    _env_integer(environ, "MASTER_PORT", minimum=1)
    if "LOCAL_RANK" in environ:
        _env_integer(environ, "LOCAL_RANK")


@contextmanager
def simulated_tp(rank: int, size: int, *, expert_parallel: bool = False) -> Iterator[None]:
    """Run the block in a load session that is rank ``rank`` of ``size`` (placing whole experts on ranks when
    ``expert_parallel``).

    Only the session's rank and size change: collectives still run over the
    real group (none in a single process, so they stay no-ops). Layers read
    rank and size when they are constructed, so build them inside the block;
    a load started inside it keeps this rank and size.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"simulated rank {rank} is outside a tensor parallel group of size {size}")
    with load_session(attrs.evolve(current_session(), tp_rank=rank, tp_size=size,
                                   enable_expert_parallel=expert_parallel)):
        yield


def _needs_upcast(t: torch.Tensor) -> bool:
    import torch

    # gloo reduces half-precision tensors slowly or not at all; sum in float32.
    return t.device.type == "cpu" and t.dtype in (torch.float16, torch.bfloat16)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over the tensor parallel group's ranks (in place when possible) and return the sum."""
    if group_size() == 1:
        return t
    import torch
    import torch.distributed as dist

    if _needs_upcast(t):
        wide = t.to(torch.float32)
        dist.all_reduce(wide, group=tensor_parallel_group())
        return wide.to(t.dtype)
    dist.all_reduce(t, group=tensor_parallel_group())
    return t


def all_gather(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in rank order (same shape on every rank)."""
    world = group_size()
    if world == 1:
        return t
    import torch
    import torch.distributed as dist

    src = t.contiguous()
    parts = [torch.empty_like(src) for _ in range(world)]
    dist.all_gather(parts, src, group=tensor_parallel_group())
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator // denominator``, or :class:`UnsupportedError` naming ``what`` when it does not divide.

    ``what`` is the config field being split, e.g. ``"num_attention_heads"``.
    """
    if denominator <= 0 or numerator % denominator:
        raise UnsupportedError(
            f"{what}={numerator} is not divisible by tensor parallel size {denominator}"
        )
    return numerator // denominator
