"""The streamer's tuning knobs as load options: concurrency, chunk size, read strategy, staging memory.

They arrive as ``load_model(..., format_options={...})`` (``--format-option
KEY=VALUE`` on the CLI). The streamer reads its settings from environment
variables when a stream starts, so :meth:`StreamerSettings.applied` sets
those for the duration of one stream and restores them afterwards; an option
left unset keeps whatever the environment (or the streamer's default) says.
``memory_limit`` is this plugin's own: the size of the staging ring
(:mod:`.staging`), the only buffer a load holds besides the parameters.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from loader.errors import UnsupportedError

from .gcs_store import emulator_endpoint
from .object_store import uses_path_style
from .staging import MIN_LIMIT, default_limit

__all__ = ["ENV_NAMES", "OPTIONS", "StreamerSettings", "parse_byte_size"]

ENV_NAMES = {
    "concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "chunk_bytesize": "RUNAI_STREAMER_CHUNK_BYTESIZE",
    "fs_strategy": "RUNAI_STREAMER_FS_STRATEGY",
}
"""Option name -> the streamer's environment variable."""

OPTIONS = ("concurrency", "memory_limit", "chunk_bytesize", "fs_strategy")
"""Every option, in the order messages list them."""

FS_STRATEGIES = ("io_uring_direct", "io_uring_buffered", "libaio_direct", "sync_buffered")
"""How the streamer reads local files, in the order it tries them (its default:
``io_uring_direct,libaio_direct,sync_buffered``). The ``direct`` ones bypass the page cache."""

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*(-?\d+)\s*([a-zA-Z]*)\s*$")


def parse_byte_size(name: str, value: Any, *, unit: bool = True) -> int:
    """An int, or a string such as ``"512MiB"`` / ``"2GB"`` (units only when ``unit``); else an error naming it."""
    expected = "a number of bytes (e.g. 1073741824 or '1GiB')" if unit else "a whole number"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or match.group(2).lower() not in _UNITS or (match.group(2) and not unit):
        raise UnsupportedError(f"format option {name!r} must be {expected}, found {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _strategies(value: Any) -> str:
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else []
    if not names or any(name not in FS_STRATEGIES for name in names):
        raise UnsupportedError(
            f"format option 'fs_strategy' must be one or more of {', '.join(FS_STRATEGIES)} "
            f"(comma-separated), found {value!r}"
        )
    return ",".join(names)


@attrs.frozen
class StreamerSettings:
    """What to tell the streamer; ``None`` keeps its default (or the environment's setting)."""

    concurrency: int | None = None
    """Threads reading files (local) or S3 clients open at once."""
    memory_limit: int | None = None
    """Bytes of the staging ring (:mod:`.staging`); unset, ``-1`` or ``0``: the largest tensor (at least 128 MiB
    from an object store)."""
    chunk_bytesize: int | None = None
    """Bytes each read request asks for."""
    fs_strategy: str | None = None
    """Local files: the read strategies to try, comma-separated (:data:`FS_STRATEGIES`)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> StreamerSettings:
        """Validate ``format_options``; an unknown key or a bad value names it and what is allowed."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UnsupportedError(
                f"unknown format option(s) {', '.join(map(repr, unknown))} for the Run:ai streamer; "
                f"known: {', '.join(OPTIONS)}"
            )
        values: dict[str, Any] = {}
        for name, raw in options.items():
            if name == "fs_strategy":
                values[name] = _strategies(raw)
                continue
            value = parse_byte_size(name, raw, unit=name != "concurrency")
            if name == "concurrency" and not 1 <= value <= 1024:
                raise UnsupportedError(f"format option 'concurrency' must be between 1 and 1024, found {value}")
            if name == "chunk_bytesize" and value < 1:
                raise UnsupportedError(f"format option 'chunk_bytesize' must be positive, found {value}")
            if name == "memory_limit" and value not in (-1, 0) and value < MIN_LIMIT:
                raise UnsupportedError(
                    f"format option 'memory_limit' must be at least {MIN_LIMIT} bytes (1MiB), or -1 or 0 for "
                    f"the checkpoint's largest tensor, found {value}"
                )
            values[name] = value
        return cls(**values)

    def ring_bytes(self, tensor_bytes: Sequence[int], remote: bool = False) -> int:
        """The staging ring's size for a stream of tensors of ``tensor_bytes``: the option, else
        :func:`~.staging.default_limit`."""
        if self.memory_limit is None or self.memory_limit in (-1, 0):
            return default_limit(tensor_bytes, remote)
        return self.memory_limit

    def environment(self) -> dict[str, str]:
        """The variables this stream sets: the options given, plus path-style addressing for custom S3 endpoints
        and ``STORAGE_EMULATOR_HOST`` as the streamer's GCS backend spells it."""
        env = {ENV_NAMES[name]: str(value) for name, value in attrs.asdict(self).items()
               if value is not None and name in ENV_NAMES}
        if uses_path_style() and "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING" not in os.environ:
            env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
        gcs_emulator = emulator_endpoint()
        if gcs_emulator is not None and "CLOUD_STORAGE_EMULATOR_ENDPOINT" not in os.environ:
            env["CLOUD_STORAGE_EMULATOR_ENDPOINT"] = gcs_emulator  # the streamer's GCS backend's name for it
        return env

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Set :meth:`environment` for one stream, then restore what was there (the process's environment is
        the only way the streamer takes these settings)."""
        env = self.environment()
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
