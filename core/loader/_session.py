"""The load in progress: plugin host, tensor-parallel rank and size, dtype and device, in one place.

The pipeline opens a :class:`LoadSession` for the duration of a load
(:func:`load_session`); layers, weight loaders and plugins read it with
:func:`current_session` instead of torch's process-global default dtype, a
process-global plugin host or a rank passed down by hand. The session lives
in a :class:`~contextvars.ContextVar`, so two loads in two threads each see
their own, and nothing process-wide is changed while a model is built.

Outside a load (a test building one layer, a tool calling a hook) the session
is the default one: the process-wide plugin host, this process's rank and size
in the ``torch.distributed`` group, torch's default dtype and the CPU.
:func:`loader._distributed.simulated_tp` is a session with another rank/size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import attrs

from ._process_group import group_rank, group_size

if TYPE_CHECKING:
    import torch

    from ._plugins import PluginHost

__all__ = ["LoadSession", "active_session", "current_session", "load_session"]


@attrs.frozen
class LoadSession:
    """What every part of one load agrees on.

    ``host`` is ``None`` for the process-wide plugin host (built on first use;
    :func:`loader._plugins.current_plugin_host` resolves it). ``dtype`` is the dtype parameters are created in,
    ``device`` the device the model is loaded for (it is built on ``meta`` first).
    ``enable_expert_parallel`` places whole experts on ranks (expert parallel size = ``tp_size``) instead of
    splitting each expert's intermediate dimension.
    """

    host: PluginHost | None
    tp_rank: int
    tp_size: int
    dtype: torch.dtype
    device: torch.device
    enable_expert_parallel: bool = False

    def __attrs_post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"rank {self.tp_rank} is outside a tensor parallel group of size {self.tp_size}")


_CURRENT: ContextVar[LoadSession | None] = ContextVar("loader_load_session", default=None)


def _default_session() -> LoadSession:
    """The session outside any load: this process's place in the real process group, torch's defaults."""
    import torch

    return LoadSession(host=None, tp_rank=group_rank(), tp_size=group_size(),
                       dtype=torch.get_default_dtype(), device=torch.device("cpu"))


def current_session() -> LoadSession:
    """The session of the load in progress in this thread (or task); the default one outside a load."""
    session = _CURRENT.get()
    return session if session is not None else _default_session()


def active_session() -> LoadSession | None:
    """The session of the load in progress in this thread (or task), or ``None`` outside a load.

    Builds no default session, so it imports no torch: the plugin host is
    found through it while ``loader plugins`` and ``loader models`` stay light.
    """
    return _CURRENT.get()


@contextmanager
def load_session(session: LoadSession) -> Iterator[LoadSession]:
    """Make ``session`` current for the block (this thread or task only); restores the previous one."""
    token = _CURRENT.set(session)
    try:
        yield session
    finally:
        _CURRENT.reset(token)
