"""The core's readers for Hugging Face side files: ``config.json`` and the tokenizer.

Registered as plugin ``core.hf_files`` with ``trylast``: formats whose files
carry their own metadata (GGUF) answer first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import Source, TokenizerBundle, WeightFormat
from .errors import ConfigError, LoadError
from .hookspecs import hookimpl

__all__ = ["load_hf_tokenizer", "loader_load_tokenizer", "loader_read_config", "read_json_object"]

MAX_JSON_BYTES = 64 * 1024 * 1024


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON object from ``path``; any problem is a :class:`ConfigError` naming the file."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ConfigError(f"{path}: {what} is {size} bytes, more than the {MAX_JSON_BYTES} allowed")
        with path.open("rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
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


@hookimpl(trylast=True)
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    folder = source.directory
    if folder is None:
        return None
    path = folder / "config.json"
    if not path.is_file():
        return None
    return read_json_object(path, "config.json")


def load_hf_tokenizer(folder: Path) -> TokenizerBundle | None:
    """Build a tokenizer from ``tokenizer.json`` (+ ``tokenizer_config.json``) in ``folder``."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise LoadError(f"{path}: cannot build a tokenizer: {exc}") from exc
    cfg_path = folder / "tokenizer_config.json"
    cfg = read_json_object(cfg_path, "tokenizer_config.json") if cfg_path.is_file() else {}

    def token_text(value: Any) -> str | None:
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    chat_template = cfg.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if chat_template is None and jinja.is_file():
        chat_template = jinja.read_text(encoding="utf-8")
    if isinstance(chat_template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        chat_template = named.get("default") or next(iter(named.values()), None)
    bos = token_text(cfg.get("bos_token"))
    eos = token_text(cfg.get("eos_token"))
    eos_ids: list[int] = []
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        gen = read_json_object(gen_path, "generation_config.json")
        raw = gen.get("eos_token_id")
        if isinstance(raw, int):
            eos_ids.append(raw)
        elif isinstance(raw, list):
            eos_ids.extend(int(x) for x in raw if isinstance(x, int))
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
        return None
    return load_hf_tokenizer(folder)
