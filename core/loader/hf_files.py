"""The core's readers for Hugging Face side files: ``config.json`` and the tokenizer.

Registered as plugin ``core.hf_files`` with ``trylast``: formats whose files
carry their own metadata (GGUF) answer first. Local folders are read from
disk; a remote source's files through its :class:`~loader.checkpoint.SourceReader`,
so a remote-source plugin need not re-implement these readers. Every reader
takes bytes as well as a path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .checkpoint import Source, TokenizerBundle, WeightFormat
from .errors import ConfigError, LoadError
from .hookspecs import hookimpl

__all__ = [
    "FileBytes",
    "load_hf_tokenizer",
    "loader_load_tokenizer",
    "loader_read_config",
    "read_json_object",
    "read_source_file",
]

MAX_JSON_BYTES = 64 * 1024 * 1024


def read_json_object(source: Path | bytes, what: str, where: str | None = None) -> dict[str, Any]:
    """Read a JSON object from a file, or parse it from bytes; any problem is a :class:`ConfigError`.

    :param source: the file, or its bytes (read through a remote source's
        :class:`~loader.checkpoint.SourceReader`).
    :param what: what the file is, for messages (``"config.json"``).
    :param where: how messages name the file when ``source`` is bytes (default ``what``).
    """
    path = where or what if isinstance(source, bytes) else source
    try:
        if isinstance(source, bytes):
            raw = source
            if len(raw) > MAX_JSON_BYTES:
                raise ConfigError(f"{path}: {what} is {len(raw)} bytes, more than the {MAX_JSON_BYTES} allowed")
        else:
            size = source.stat().st_size
            if size > MAX_JSON_BYTES:
                raise ConfigError(f"{path}: {what} is {size} bytes, more than the {MAX_JSON_BYTES} allowed")
            with source.open("rb") as fh:
                raw = fh.read()
        data = json.loads(raw.decode("utf-8"))
    except ConfigError:
        raise
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except (ValueError, RecursionError) as exc:  # an integer too long to convert, nesting too deep
        raise ConfigError(f"{path}: {what} is not valid JSON ({exc})") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a JSON object, found {type(data).__name__}")
    return data


def read_source_file(source: Source, name: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """A small file of a remote source by relative name, through its reader; ``None`` if absent.

    More than ``limit`` bytes is a :class:`ConfigError` naming the file.
    """
    if source.reader is None:
        return None
    data = source.reader.read_bytes(name, limit)
    if data is not None and len(data) > limit:
        raise ConfigError(f"{source.file_uri(name)}: more than the {limit} bytes allowed for {name}")
    return data


@hookimpl(trylast=True)
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    folder = source.directory
    if folder is None:
        data = read_source_file(source, "config.json")
        return None if data is None else read_json_object(data, "config.json", source.file_uri("config.json"))
    path = folder / "config.json"
    if not path.is_file():
        return None
    return read_json_object(path, "config.json")


FileBytes = Callable[[str], "bytes | None"]
"""Reads a checkpoint's small file by relative name: its bytes, or ``None`` when there is none."""


def _folder_bytes(folder: Path) -> FileBytes:
    def read(name: str) -> bytes | None:
        path = folder / name
        return path.read_bytes() if path.is_file() else None

    return read


def load_hf_tokenizer(files: Path | FileBytes, where: str | None = None) -> TokenizerBundle | None:
    """Build a tokenizer from ``tokenizer.json`` (+ ``tokenizer_config.json``, ...).

    :param files: the folder holding them, or a function reading them as bytes by name
        (a remote source's files, see :func:`read_source_file`).
    :param where: how messages name the folder when ``files`` is a function.
    """
    if isinstance(files, Path):
        where, read = str(files), _folder_bytes(files)
    else:
        where, read = where or "<source>", files
    raw = read("tokenizer.json")
    if raw is None:
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:
        raise LoadError(f"{where}/tokenizer.json: cannot build a tokenizer: {exc}") from exc

    def side_json(name: str) -> dict[str, Any]:
        data = read(name)
        return {} if data is None else read_json_object(data, name, f"{where}/{name}")

    cfg = side_json("tokenizer_config.json")

    def token_text(value: Any) -> str | None:
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    chat_template = cfg.get("chat_template")
    jinja = read("chat_template.jinja") if chat_template is None else None
    if jinja is not None:
        chat_template = jinja.decode("utf-8")
    if isinstance(chat_template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        chat_template = named.get("default") or next(iter(named.values()), None)
    bos = token_text(cfg.get("bos_token"))
    eos = token_text(cfg.get("eos_token"))
    eos_ids: list[int] = []
    raw_eos = side_json("generation_config.json").get("eos_token_id")
    if isinstance(raw_eos, int):
        eos_ids.append(raw_eos)
    elif isinstance(raw_eos, list):
        eos_ids.extend(int(x) for x in raw_eos if isinstance(x, int))
    if eos is not None:
        tid = tokenizer.token_to_id(eos)
        if tid is not None and tid not in eos_ids:
            eos_ids.append(tid)
    return TokenizerBundle(
        tokenizer=tokenizer,
        chat_template=chat_template if isinstance(chat_template, str) else None,
        bos_token=bos,
        eos_token=eos,
        eos_token_ids=tuple(eos_ids),
        add_bos_token=bool(cfg.get("add_bos_token", False)),
    )


@hookimpl(trylast=True)
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    folder = source.directory
    if folder is None:
        if source.reader is None:
            return None
        return load_hf_tokenizer(lambda name: read_source_file(source, name), (source.uri or source.location))
    return load_hf_tokenizer(folder)
