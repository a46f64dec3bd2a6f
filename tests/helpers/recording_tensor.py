"""A checkpoint tensor that records which region of the full tensor each read touched.

Tests use it to prove a weight loader narrows *before* reading: every read
logs ``((start, length), ...)`` per dimension of the original tensor.
"""

from __future__ import annotations

import torch

from loader.weights import CheckpointTensor


class RecordingTensor(CheckpointTensor):
    """``base`` viewed through per-dimension ``(start, length)`` windows; reads go to ``log``."""

    def __init__(self, base: torch.Tensor, name: str = "w", file: str = "model.safetensors",
                 window: tuple[tuple[int, int], ...] | None = None,
                 log: list[tuple[tuple[int, int], ...]] | None = None) -> None:
        self.base = base
        self.name = name
        self.file = file
        self.window = window if window is not None else tuple((0, s) for s in base.shape)
        self.log: list[tuple[tuple[int, int], ...]] = log if log is not None else []

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(length for _, length in self.window)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def narrow(self, dim: int, start: int, length: int) -> RecordingTensor:
        dim = self.check_narrow(dim, start, length)
        window = list(self.window)
        window[dim] = (window[dim][0] + start, length)
        return RecordingTensor(self.base, self.name, self.file, tuple(window), self.log)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        self.log.append(self.window)
        t = self.base
        for dim, (start, length) in enumerate(self.window):
            t = t.narrow(dim, start, length)
        return t.to(dtype or self.dtype).clone().contiguous()
