"""Where a tensorizer checkpoint lives: its ``.tensors`` file(s) and the folder of side files beside them.

A local folder needs nothing of this: the core resolves it and the detection
lists it. Everything else resolves to a :class:`TensorizedSource`, the
:class:`~loader.checkpoint.SourceReader` through which the core reads
``config.json`` and the tokenizer as for a local folder:

- a ``.tensors`` file (or a ``%03d`` per-rank pattern) anywhere: its side files are its folder's;
- an ``s3://`` or ``http(s)://`` folder asked for with ``load_format="tensorizer"``;
- any SOURCE with the format option ``tensorizer_uri`` (vLLM's spelling): side files from SOURCE, tensors
  from the URI.

HTTP cannot list a folder, so an ``http(s)://`` folder offers the side files it has among the names a
checkpoint uses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from loader.checkpoint import Source

from .formats import MARKER, SUFFIX, is_remote, rank_file_name
from .options import TensorizerOptions
from .remote import RemoteFile, list_s3_prefix

__all__ = ["TensorizedSource", "parent_of", "resolve_tensorized"]

HTTP_SIDE_NAMES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
                   MARKER, f"model{SUFFIX}", rank_file_name(0))


def parent_of(location: str) -> str:
    """The folder holding ``location`` (a path or URI), ending with ``/`` for URIs."""
    if is_remote(location):
        return location.rsplit("/", 1)[0] + "/"
    return str(Path(location).parent)


def join(folder: str, name: str) -> str:
    """``name`` inside ``folder`` (a path or a URI)."""
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return str(Path(folder) / name)


class TensorizedSource:
    """Side files from ``folder``; tensors from ``tensors`` (a file, a ``%03d`` pattern) or found in ``folder``."""

    def __init__(self, folder: str, tensors: str | None, options: TensorizerOptions) -> None:
        self.folder = folder
        self.tensors = tensors
        self.options = options
        self._names: list[str] | None = None

    def __repr__(self) -> str:
        return f"TensorizedSource({self.folder!r}, tensors={self.tensors!r})"

    def list_files(self) -> Sequence[str]:
        if self._names is None:
            if self.folder.startswith("s3://"):
                self._names = list_s3_prefix(self.folder, self.options)
            elif is_remote(self.folder):
                self._names = [n for n in HTTP_SIDE_NAMES if RemoteFile(join(self.folder, n), self.options).exists()]
            else:
                folder = Path(self.folder)
                self._names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        return self._names

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        location = join(self.folder, name)
        if not is_remote(location):
            try:
                with open(location, "rb") as handle:
                    return handle.read(limit + 1)
            except FileNotFoundError:
                return None
        remote = RemoteFile(location, self.options)
        try:
            return remote.read(0, limit + 1) if remote.exists() else None
        except FileNotFoundError:
            return None


def resolve_tensorized(location: str, load_format: str, options: TensorizerOptions) -> Source | None:
    """The source for ``location`` when this plugin should read it (see the module docstring), else ``None``."""
    if options.tensorizer_uri is not None:
        folder = location if is_remote(location) or os.path.isdir(location) else parent_of(location)
        reader = TensorizedSource(folder, options.tensorizer_uri, options)
        return Source(location=location, path=None, uri=options.tensorizer_uri, reader=reader)
    if location.rstrip("/").endswith(SUFFIX) and (is_remote(location) or "%" in location):
        reader = TensorizedSource(parent_of(location), location, options)
        return Source(location=location, path=None, uri=location, reader=reader)
    if is_remote(location) and load_format == "tensorizer":
        folder = location.rstrip("/") + "/"
        return Source(location=location, path=None, uri=folder, reader=TensorizedSource(folder, None, options))
    return None
