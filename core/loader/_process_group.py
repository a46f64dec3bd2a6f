"""The ``torch.distributed`` group loader's tensor parallelism runs over, and this process's rank and size in it.

By default that is torch's default group (every process ``torchrun``
started): rank and size 0 and 1 when there is none. A job where some
processes are not inference ranks (a trainer beside a TP group, sharing one
world so it can broadcast new weights to them) names the inference ranks'
own group with :func:`set_tensor_parallel_group` before loading: layers then
size their shards by that group and all-reduce over it only.

A leaf: the load session's defaults (:mod:`loader._session`) and the
collectives (:mod:`loader._distributed`) both read it. torch is imported on
first call, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ConfigError, UnsupportedError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["group_rank", "group_size", "set_tensor_parallel_group", "tensor_parallel_group"]

_tp_group: ProcessGroup | None = None


def set_tensor_parallel_group(group: ProcessGroup | None) -> None:
    """Make ``group`` the tensor parallel group of the models this process loads from now on.

    Every process of the job creates the group with ``torch.distributed.new_group(ranks)`` (torch requires all
    of them to take part), and each member calls this before :func:`loader.load_model`. ``None`` goes back to
    torch's default group. A model keeps the shard size it was loaded with: change the group between models,
    never under one in use.

    :raises loader.ConfigError: ``torch.distributed`` is not initialized, or this process is not in ``group``.
    :raises loader.UnsupportedError: ``group`` is not a ``torch.distributed`` process group.
    """
    global _tp_group
    if group is None:
        _tp_group = None
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("set_tensor_parallel_group needs torch.distributed initialized first "
                          "(torch.distributed.init_process_group, then new_group on every process)")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ConfigError(f"this process (rank {dist.get_rank()}) is not in the group given to "
                          "set_tensor_parallel_group; only the group's members call it")
    if not isinstance(group, dist.ProcessGroup):
        raise UnsupportedError(f"set_tensor_parallel_group takes a torch.distributed process group (from "
                               f"torch.distributed.new_group) or None, found a {type(group).__name__}")
    _tp_group = group


def tensor_parallel_group() -> ProcessGroup | None:
    """The group set with :func:`set_tensor_parallel_group`; ``None`` for torch's default group."""
    return _tp_group


def group_size() -> int:
    """Size of the tensor parallel group (1 when there is no process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size(_tp_group))
    return 1


def group_rank() -> int:
    """This process's rank in the tensor parallel group (0 when there is no process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank(_tp_group))
    return 0
