"""This process's rank and world size in the ``torch.distributed`` group (0 and 1 when there is none).

A leaf: the load session's defaults (:mod:`loader._session`) and the
collectives (:mod:`loader._distributed`) both read it. torch is imported on
first call, so importing this module stays cheap.
"""

from __future__ import annotations

__all__ = ["group_rank", "group_size"]


def group_size() -> int:
    """World size of the real process group (1 when there is none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def group_rank() -> int:
    """This process's rank in the real process group (0 when there is none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0
