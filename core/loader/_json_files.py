"""Reading a small JSON object (config, index, marker) with one set of limits and messages.

A leaf module: :mod:`loader.checkpoint` re-exports it, and modules that
``loader.checkpoint`` itself imports (the sharded-state layout) use it without
an import cycle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["MAX_JSON_BYTES", "read_json_object"]

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
