"""Tensors handed out while they still sit in the streamer's reused buffers.

The streamer runs with ``owned=False``: each tensor it yields is a view into a
ring buffer that it refills once the stream advances (vLLM once shipped
corrupted weights by keeping such views). A :class:`StreamedTensor` is a
handle on one :class:`StreamSlot`; the stream calls :meth:`StreamSlot.release`
before it asks the streamer for the next tensor, and then

- a slot nobody read yet is copied out whole into memory of its own, so a
  consumer that holds handles across steps (a quantization bundling side
  tensors) still reads the right values later;
- a slot that was read is dropped: the common path (a weight loader narrows
  and reads at once) copies only this rank's rows, straight into the
  parameter, and never pays for a second copy. Reading it again afterwards
  raises instead of returning whatever the buffer holds by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.weights import CheckpointTensor

if TYPE_CHECKING:
    import torch

__all__ = ["StreamSlot", "StreamedTensor"]


class StreamSlot:
    """One tensor's values while the stream is on it; see the module docstring for what release does."""

    def __init__(self, values: torch.Tensor, name: str, file: str) -> None:
        self.name = name
        self.file = file
        self.shape = tuple(values.shape)
        self.dtype = values.dtype
        self._values: torch.Tensor | None = values
        self._owned = False
        self.reads = 0

    @property
    def owned(self) -> bool:
        """Whether the values were copied out of the streamer's buffer."""
        return self._owned

    def values(self) -> torch.Tensor:
        """The values; raises once the stream moved past a slot that had already been read."""
        if self._values is None:
            raise RuntimeError(
                f"tensor {self.name!r} in {self.file} was read again after the Run:ai stream moved past it; "
                "its buffer has been reused (read a streamed tensor once, or keep it unread until needed)"
            )
        self.reads += 1
        return self._values

    def release(self) -> None:
        """The stream is about to advance: copy out an unread slot, drop a read one."""
        if self._owned or self._values is None:
            return
        if self.reads:
            self._values = None
        else:
            self._values = self._values.clone()
            self._owned = True


class StreamedTensor(CheckpointTensor):
    """A (possibly narrowed) handle on a :class:`StreamSlot`; narrowing is a view, reading copies."""

    def __init__(self, slot: StreamSlot, narrows: tuple[tuple[int, int, int], ...] = ()) -> None:
        self.slot = slot
        self.narrows = narrows
        self.name = slot.name
        self.file = slot.file
        shape = list(slot.shape)
        for dim, _, length in narrows:
            shape[dim] = length
        self._shape = tuple(shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self.slot.dtype

    def narrow(self, dim: int, start: int, length: int) -> StreamedTensor:
        dim = self.check_narrow(dim, start, length)
        return StreamedTensor(self.slot, (*self.narrows, (dim, start, length)))

    def _view(self) -> torch.Tensor:
        view = self.slot.values()
        for dim, start, length in self.narrows:
            view = view.narrow(dim, start, length)
        return view

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        out = torch.empty(self.shape, dtype=dtype or self.dtype)
        out.copy_(self._view())
        return out

    def read_into(self, out: torch.Tensor) -> None:
        import torch

        self.check_destination(out)
        with torch.no_grad():
            out.detach().copy_(self._view())
