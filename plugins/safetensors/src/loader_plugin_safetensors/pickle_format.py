"""PyTorch ``.bin`` / ``.pt`` weight files, loaded with the safe unpickler only.

A pickle can run arbitrary code when loaded, so every file goes through
torch's weights-only unpickler (what ``torch.load(weights_only=True)`` uses),
which rebuilds only tensors and plain containers and refuses anything else; a
refusal becomes a :class:`~loader.errors.CheckpointFormatError` naming the
file. Zip-format files (every ``torch.save`` since 1.6) are read record by
record (:mod:`.pickle_zip`): a tensor stored in place is a lazy handle read
with positioned reads only when a weight loader reads its (narrowed) slice;
legacy files are read whole. Tensors in memory are wrapped in
:class:`CountedEagerTensor`, which counts the bytes of the view each read copies.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from loader.errors import CheckpointFormatError
from loader.weights import CheckpointTensor, EagerTensor, ReadStats

from .file_access import SharedDescriptor

if TYPE_CHECKING:
    import torch

__all__ = ["CountedEagerTensor", "iter_pt_weights", "load_pt_file"]

_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation",
                "In PyTorch 2.6", "Re-running `torch.load`")


class CountedEagerTensor(EagerTensor):
    """An in-memory (or memory-mapped) tensor whose reads add their bytes to a load's stats."""

    def __init__(self, tensor: torch.Tensor, name: str, file: str, stats: ReadStats | None) -> None:
        super().__init__(tensor, name, file)
        self.stats = stats

    def narrow(self, dim: int, start: int, length: int) -> CountedEagerTensor:
        dim = self.check_narrow(dim, start, length)
        return CountedEagerTensor(self.tensor.narrow(dim, start, length), self.name, self.file, self.stats)

    def _count(self) -> None:
        if self.stats is not None:
            self.stats.add(self.tensor.numel() * self.tensor.element_size(), tensors=1)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        values = super().read(dtype)
        self._count()
        return values

    def read_into(self, out: torch.Tensor) -> None:
        super().read_into(out)
        self._count()


def _refusal_detail(exc: BaseException) -> str:
    # torch's message wraps the one useful fact (the refused global) in advice to turn the check off
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    if refused:
        return f"unsupported global {refused.group(1)}"
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith(_BOILERPLATE)]
    detail = " ".join(kept).replace("WeightsUnpickler error:", "").strip()
    return detail or type(exc).__name__


def _starts_like_a_zip(path: str) -> bool:
    """torch.load's own test: a zip archive's first local header magic (a cut archive still has it)."""
    with open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def _load_legacy(path: str) -> Any:
    """``torch.load`` of a pre-1.6 (or bare) pickle, whatever the untrusted bytecode makes it raise worded
    as an unpickling failure (the weights-only unpickler lets ``IndexError`` and others through)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except (pickle.UnpicklingError, OSError, RuntimeError, EOFError, ValueError):
        raise
    except Exception as exc:
        raise pickle.UnpicklingError(f"{type(exc).__name__}: {exc}") from exc


def load_pt_file(path: str, stats: ReadStats | None = None) -> tuple[Mapping[str, Any], SharedDescriptor | None]:
    """Unpickle one file safely: a zip archive record by record, a legacy file whole with ``torch.load``.

    Returns the state dict (lazy handles or tensors) and, for a zip archive, the
    descriptor its handles read through.

    :raises CheckpointFormatError: if the file would execute code when unpickled, or is not a checkpoint.
    """
    from .pickle_zip import load_zip_checkpoint

    descriptor: SharedDescriptor | None = None
    try:
        if _starts_like_a_zip(path):
            try:
                loaded, descriptor = load_zip_checkpoint(path, stats)
            except (CheckpointFormatError, pickle.UnpicklingError):
                _name_unusual_tensor(path)
                raise
        else:
            loaded = _load_legacy(path)
    except pickle.UnpicklingError as exc:
        detail = _refusal_detail(exc)
        if "global" in detail.lower():
            raise CheckpointFormatError(
                f"{path}: refused to load this pickle because it would execute code ({detail}); "
                "only plain tensors are accepted. Convert it to safetensors if you trust its origin"
            ) from exc
        raise CheckpointFormatError(
            f"{path}: not a PyTorch checkpoint the safe unpickler accepts ({detail})"
        ) from exc
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointFormatError(f"{path}: cannot read as a PyTorch checkpoint: {reason}") from exc
    if not isinstance(loaded, Mapping):
        raise CheckpointFormatError(
            f"{path}: expected a state dict (a mapping of names to tensors), found {type(loaded).__name__}"
        )
    return loaded, descriptor


def _name_unusual_tensor(path: str) -> None:
    """After the lazy reader refused an archive, name the entry that made it refuse, if ``torch.load`` can.

    The lazy reader rebuilds tensors over meta storages, so a quantized or
    sparse tensor fails inside the unpickler, before its state-dict name is
    known. ``torch.load`` (weights only) rebuilds such tensors for real; its
    result is checked entry by entry for the named error. Runs only on the
    failure path, so a good checkpoint is never read twice.
    """
    try:
        loaded = _load_legacy(path)
    except Exception:  # noqa: BLE001 - torch refuses too: the caller's own error stands
        return
    if isinstance(loaded, Mapping):
        for name, value in loaded.items():
            _check_entry(path, name, value)


def _check_entry(path: str, name: object, value: object) -> None:
    """One state-dict entry must be a string name and a plain dense tensor with data.

    ``torch.load(weights_only=True)`` accepts any key and quantized, sparse and ``meta`` tensors; passed
    on, each fails later inside the model's ``load_weights``, blamed on the model class.
    """
    import torch

    if not isinstance(name, str):
        raise CheckpointFormatError(
            f"{path}: state dict key {name!r} ({type(name).__name__}) is not a string; keys must be tensor names"
        )
    if isinstance(value, CheckpointTensor):
        return  # a stored storage record, read lazily: dense by construction
    if not isinstance(value, torch.Tensor):
        raise CheckpointFormatError(
            f"{path}: entry {name!r} is a {type(value).__name__}, expected a tensor "
            "(nested state dicts are not supported)"
        )
    if value.is_quantized:
        kind = f"a quantized ({value.dtype}) tensor"
    elif value.layout != torch.strided:
        kind = f"a sparse ({value.layout}) tensor"
    elif value.is_meta:
        kind = "a meta tensor (shape only, no data)"
    else:
        return
    raise CheckpointFormatError(f"{path}: tensor {name!r} is {kind}; only plain dense tensors can be loaded")


def iter_pt_weights(
    files: Iterable[str], stats: ReadStats | None = None
) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield ``(name, CountedEagerTensor)`` for each tensor of each ``.bin``/``.pt`` file.

    A file is loaded when the iterator reaches it and dropped when it moves on.
    """

    owner: dict[str, str] = {}
    for path in files:
        state, descriptor = load_pt_file(path, stats)
        for name, value in state.items():
            _check_entry(path, name, value)
            first = owner.setdefault(name, path)
            if first != path:
                raise CheckpointFormatError(
                    f"tensor {name!r} appears in two files of one checkpoint: {first} and {path}"
                )
        if descriptor is not None:
            descriptor.hold()
        try:
            for name, value in state.items():
                yield name, value if isinstance(value, CheckpointTensor) else CountedEagerTensor(
                    value, name, path, stats)
        finally:
            if descriptor is not None:
                descriptor.release()
        del state
