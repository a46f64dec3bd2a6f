"""``save_sharded``: load once per rank, write each rank's post-processed state.

Ranks are built one after another in this process with
:func:`loader._distributed.simulated_tp`, so cutting a checkpoint for tp=8
needs neither eight processes nor eight GPUs, and memory stays at one rank's shard.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from .._distributed import simulated_tp
from .._pipeline.load import build_options, load_model_with_report
from .._pipeline.prepare import SourceLocation, prepare_checkpoint, source_location
from .._plugins import _core_version
from .._sharded_layout import ShardedLayout, part_file_name, write_marker
from ..checkpoint import Source, read_source_file
from ..errors import SourceNotFoundError, UnsupportedError
from .writer import write_safetensors

__all__ = ["SavedShards", "save_sharded", "state_for_saving"]

DEFAULT_MAX_PART_BYTES = 5 * 1000**3
SIDE_FILE_PATTERNS = ("tokenizer*", "*.jinja", "*.model", "generation_config.json", "special_tokens_map.json",
                      "vocab.json", "merges.txt", "chat_template.json")


@attrs.frozen
class SavedShards:
    """What ``save_sharded`` wrote."""

    folder: str
    tp_size: int
    files: tuple[str, ...]
    bytes_written: int


def state_for_saving(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters (tied ones once, under their first name) and persistent buffers."""
    items: list[tuple[str, torch.Tensor]] = [(n, p.data) for n, p in model.named_parameters()]
    params = {n for n, _ in items}
    for name, buf in model.state_dict(keep_vars=True).items():
        if name not in params and isinstance(buf, torch.Tensor) and not isinstance(buf, nn.Parameter):
            items.append((name, buf))
    return items


def _split(items: list[tuple[str, torch.Tensor]], max_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    parts: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if parts[-1] and size + nbytes > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append((name, tensor))
        size += nbytes
    return parts


def _copy_side_files(source: Source, out: Path) -> None:
    """The tokenizer files beside the weights, from a local folder or through a remote source's reader."""
    if source.directory is not None:
        for pattern in SIDE_FILE_PATTERNS:
            for path in source.directory.glob(pattern):
                if path.is_file():
                    shutil.copy2(path, out / path.name)
        return
    if source.reader is None:
        return
    for name in source.reader.list_files():
        if "/" not in name and any(fnmatch.fnmatchcase(name, pattern) for pattern in SIDE_FILE_PATTERNS):
            data = read_source_file(source, name)
            if data is not None:
                (out / name).write_bytes(data)


def _create_output_folder(folder: Path) -> None:
    """Create ``folder`` (it may exist, empty); a folder that cannot be made is the user's error, named."""
    try:
        if folder.exists() and any(folder.iterdir()):
            raise SourceNotFoundError(f"{folder}: output folder exists and is not empty")
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsupportedError(f"{folder}: cannot create the output folder ({exc.strerror or exc})") from exc


def save_sharded(source: SourceLocation, out: str | Path, *, tp_size: int, dtype: Any = "bfloat16",
                 load_format: str = "auto", max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
                 revision: str | None = None) -> SavedShards:
    """Write ``source`` cut for ``tp_size`` ranks into ``out``."""
    source = source_location(source)

    if tp_size < 1:
        raise UnsupportedError(f"--tp must be at least 1, found {tp_size}")
    if isinstance(max_part_bytes, bool) or not isinstance(max_part_bytes, int) or max_part_bytes < 1:
        raise UnsupportedError(f"max_part_bytes must be a positive integer, found {max_part_bytes!r}")
    folder = Path(out)
    _create_output_folder(folder)
    files: list[str] = []
    written = 0
    hf_config: Mapping[str, Any] = {}
    architecture = ""
    dtype_name = ""
    for rank in range(tp_size):
        with simulated_tp(rank, tp_size):
            model, report = load_model_with_report(source, dtype=dtype, load_format=load_format, revision=revision)
        if report.quantization is not None:
            raise UnsupportedError("save-sharded does not support quantized models yet (their post-processed "
                                   "layout is plugin-specific)")
        architecture, dtype_name = report.architecture, report.dtype
        for part, tensors in enumerate(_split(state_for_saving(model), max_part_bytes)):
            path = folder / part_file_name(rank, part)
            written += write_safetensors(path, tensors, {"format": "pt", "rank": str(rank)})
            files.append(str(path))
        del model
    options = build_options(dtype=dtype, load_format=load_format, revision=revision)
    prepared = prepare_checkpoint(source, options)
    hf_config = prepared.hf_config
    (folder / "config.json").write_text(json.dumps(dict(hf_config), indent=2, default=str) + "\n")
    _copy_side_files(prepared.source, folder)

    write_marker(folder, ShardedLayout(tp_size=tp_size, dtype=dtype_name, architecture=architecture,
                                       loader_version=_core_version()))
    return SavedShards(folder=str(folder), tp_size=tp_size, files=tuple(files), bytes_written=written)
