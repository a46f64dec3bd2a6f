"""``save_tensorized``: load once per rank, write each rank's parameters as one ``.tensors`` file.

Ranks are built one after another in this process (:func:`loader.testing.simulated_tp`), as
``loader save-sharded`` does, so cutting for tp=8 needs neither eight processes nor eight GPUs and memory
stays at one rank's shard. Each file holds that rank's parameters under their own names, fused, cut and
post-processed (tied ones once) and persistent buffers, written by tensorizer's ``TensorSerializer``
(encrypted with the key file's key when asked); ``tensorized.json`` records the TP size, and the config and
tokenizer files are copied beside them. The output is a local folder or an ``s3://`` prefix.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

import loader
from loader.errors import UnsupportedError
from loader.testing import simulated_tp

from .formats import MARKER, rank_file_name
from .keys import encryption_for
from .options import TensorizerOptions
from .remote import s3_client
from .source import TensorizedSource, join, parent_of

__all__ = ["SIDE_FILES", "SavedTensorized", "save_tensorized"]

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "vocab.json",
              "merges.txt", "*.model", "*.jinja", "chat_template.json")


@attrs.frozen
class SavedTensorized:
    """What ``save_tensorized`` wrote."""

    folder: str
    tp_size: int
    files: tuple[str, ...]
    bytes_written: int
    encrypted: bool


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once, under their first name) and persistent buffers, contiguous on the CPU."""
    state = {name: param.data for name, param in model.named_parameters()}
    for name, value in model.state_dict(keep_vars=True).items():
        if name not in state and isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            state[name] = value
    return {name: value.detach().to("cpu").contiguous() for name, value in state.items()}


def _writer(target: str, options: TensorizerOptions) -> Any:
    if target.startswith("s3://"):
        from tensorizer import stream_io

        return stream_io.open_stream(target, "wb", **options.s3_arguments())
    return target


def _put(target: str, data: bytes, options: TensorizerOptions) -> None:
    if target.startswith("s3://"):
        bucket, _, key = target.removeprefix("s3://").partition("/")
        s3_client(options).put_object(Bucket=bucket, Key=key, Body=data)
    else:
        Path(target).write_bytes(data)


def _prepare_output(out: str, options: TensorizerOptions) -> None:
    """A local folder is created and must be empty; an ``s3://`` prefix must hold no objects."""
    if out.startswith("s3://"):
        if TensorizedSource(out.rstrip("/") + "/", None, options).list_files():
            raise UnsupportedError(f"{out}: output prefix is not empty")
        return
    if out.startswith(("http://", "https://")):
        raise UnsupportedError(f"{out}: save-tensorized writes to a local folder or s3://, not HTTP")
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise UnsupportedError(f"{out}: output folder exists and is not empty")
    folder.mkdir(parents=True, exist_ok=True)


def _copy_side_files(source: str, out: str, options: TensorizerOptions) -> None:
    """config.json and the tokenizer files of a local, ``s3://`` or ``http(s)://`` SOURCE, beside the output."""
    folder = source if Path(source).is_dir() or source.endswith("/") else None
    if folder is None:
        folder = parent_of(source) if "://" in source or Path(source).is_file() else source
    reader = TensorizedSource(folder, None, options)
    for name in reader.list_files():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in SIDE_FILES):
            data = reader.read_bytes(name, 64 * 2**20)
            if data is not None:
                _put(join(out, name), data, options)


def _write_rank(model: nn.Module, target: str, encryption: Any, options: TensorizerOptions) -> int:
    from tensorizer import TensorSerializer

    state = _state(model)
    serializer = TensorSerializer(_writer(target, options), encryption=encryption)
    serializer.write_state_dict(state)
    serializer.close()
    return sum(value.numel() * value.element_size() for value in state.values())


def save_tensorized(source: str, out: str | Path, *, tp_size: int = 1, dtype: Any = "bfloat16",
                    load_format: str = "auto", encrypt: str | Path | None = None,
                    format_options: dict[str, Any] | None = None, revision: str | None = None) -> SavedTensorized:
    """Write ``source`` cut for ``tp_size`` ranks into ``out`` (a folder or ``s3://`` prefix).

    :param encrypt: a key file: its 32-byte key encrypts every file (a missing file gets a new random key).
    :param format_options: the source's format options (and the S3 settings for an ``s3://`` output).
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise UnsupportedError(f"-tp must be a positive integer, found {tp_size!r}")
    target = str(out).rstrip("/") if str(out).startswith("s3://") else str(out)
    settings = TensorizerOptions.from_options({k: v for k, v in (format_options or {}).items()
                                               if k.startswith("s3_")})
    _prepare_output(target, settings)
    encryption = encryption_for(Path(encrypt)) if encrypt is not None else None
    files: list[str] = []
    written = 0
    architecture = dtype_name = ""
    for rank in range(tp_size):
        with simulated_tp(rank, tp_size):
            model, report = loader.load_model_with_report(source, dtype=dtype, load_format=load_format,
                                                          format_options=format_options, revision=revision)
        if report.quantization is not None:
            raise UnsupportedError("save-tensorized does not support quantized models (their post-processed "
                                   "layout is plugin-specific)")
        architecture, dtype_name = report.architecture, report.dtype
        path = join(target, rank_file_name(rank))
        written += _write_rank(model, path, encryption, settings)
        files.append(path)
        del model
    _copy_side_files(source, target, settings)
    marker = {"tp_size": tp_size, "dtype": dtype_name, "architecture": architecture,
              "encrypted": encryption is not None, "loader_version": loader.__version__}
    _put(join(target, MARKER), (json.dumps(marker, indent=2) + "\n").encode(), settings)
    return SavedTensorized(folder=target, tp_size=tp_size, files=tuple(files), bytes_written=written,
                           encrypted=encryption is not None)
