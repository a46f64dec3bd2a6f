"""Step 1 of the pipeline: from what the user passed to a format, its files and a config.

Resolve the source, let the format plugins choose a format, then apply the
rules that hold for every format and every source (a remote one's index is
read through its reader, :mod:`.remote_index`): keep only the files the index's
``weight_map`` names (failing if the index names one that is missing or points
outside the model folder), drop training artifacts and ``original/**``, and
fail if nothing is left.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from .. import _hooks
from .._model_folder import FolderBoundary
from .._options import LoadOptions
from .._plugins import PluginHost, use_plugin_host
from .._session import current_session
from ..checkpoint import Source, WeightFormat, is_training_artifact, read_json_object
from ..errors import CheckpointFormatError, ConfigError, SourceNotFoundError, UnsupportedError
from .weight_map import weight_map_files

__all__ = ["PreparedCheckpoint", "SourceLocation", "filter_weight_files", "prepare_checkpoint", "source_location"]

SourceLocation = str | os.PathLike[str]
"""What the public functions take as a checkpoint's location: a string, or a path object as ``transformers``'
``from_pretrained`` takes."""


def source_location(source: object) -> str:
    """``source`` as the string every hook is handed (a path object becomes its path).

    :raises UnsupportedError: for anything else (bytes included: a location is text).
    """
    if isinstance(source, str):
        return source
    if isinstance(source, os.PathLike):
        location = os.fspath(source)
        if isinstance(location, str):
            return location
    raise UnsupportedError(f"source must be a path or a string (a folder, a file, a Hub id or a URI), found "
                           f"{type(source).__name__} {source!r:.80}")

MAX_INDEX_FILES = 65_536
"""Different shard files one index may name: far above any published checkpoint (hundreds), and a
bound on the file-system calls a hostile index can ask for (each file is checked once)."""

@attrs.frozen
class PreparedCheckpoint:
    """Everything step 1 decided: the source, its format and files, and the config."""

    source: Source
    weight_format: WeightFormat
    hf_config: Mapping[str, Any]

    def config_origin(self) -> str:
        """Where the configuration came from, for messages: a GGUF file's metadata, not ``config.json``."""
        if self.weight_format.name == "gguf" and self.weight_format.files:
            return f"GGUF file {Path(self.weight_format.files[0]).name} (metadata general.architecture):"
        return "config.json"

    @property
    def architectures(self) -> list[str]:
        archs = self.hf_config.get("architectures")
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ConfigError(
                f"{self.source.display()}: config field 'architectures' must be a non-empty list of "
                f"names, found {archs!r}"
            )
        return archs


def _in_original(folder: Path | None, file: str) -> bool:
    if folder is None:
        return "/original/" in file
    try:
        rel = Path(file).relative_to(folder)
    except ValueError:
        return False
    return bool(rel.parts) and rel.parts[0] == "original"


def _index_files(index_path: Path, folder: Path, boundary: FolderBoundary) -> set[Path]:
    first_tensor = weight_map_files(read_json_object(index_path, "weight index"), str(index_path), MAX_INDEX_FILES)
    named: set[Path] = set()
    present: set[Path] = set()
    for file, tensor in first_tensor.items():
        path = folder / PurePosixPath(file)
        try:
            linked = path.is_symlink() or path.exists()
            is_file = path.is_file()
        except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
            raise CheckpointFormatError(
                f"{index_path}: weight_map[{tensor!r}] = {file!r} is not a usable file name ({exc})"
            ) from exc
        if linked:
            boundary.require_inside(path, label=f"{index_path}: shard {file!r}")
        if is_file:
            present.add(path)
        named.add(path)
    missing = sorted(str(p.relative_to(folder)) for p in named if p not in present)
    if missing:
        raise SourceNotFoundError(
            f"{index_path}: the index names shard(s) that do not exist: {', '.join(missing)}"
        )
    return named


def filter_weight_files(source: Source, weight_format: WeightFormat) -> WeightFormat:
    """Apply the index, drop training artifacts and ``original/**``; fail if nothing is left.

    A format that lists no files at all (``dummy`` on a folder holding only a
    config) needs none and passes through.
    """
    if not weight_format.files and weight_format.index is None:
        return weight_format
    folder = source.directory
    files = [f for f in weight_format.files if not is_training_artifact(f) and not _in_original(folder, f)]
    boundary = FolderBoundary.of(folder) if folder is not None else None
    if weight_format.index is not None and folder is not None and boundary is not None:
        boundary.require_inside(Path(weight_format.index))
        named = _index_files(Path(weight_format.index), folder, boundary)
        named_real = {p: p.resolve() for p in named}  # each path resolved once (a readlink walk per call)
        wanted = set(named_real.values())
        files_real = {f: Path(f).resolve() for f in files}
        files = [f for f in files if files_real[f] in wanted]
        present = {files_real[f] for f in files}
        absent = sorted(str(p.relative_to(folder)) for p, real in named_real.items() if real not in present)
        if absent:
            raise SourceNotFoundError(
                f"{weight_format.index}: the index names shard(s) the {weight_format.name} format did not "
                f"list: {', '.join(absent)}"
            )
    elif weight_format.index is not None and source.reader is not None:
        from .remote_index import filter_by_remote_index  # a remote source only: a local load never imports it

        files = filter_by_remote_index(source, weight_format, files)
    if not files:
        raise SourceNotFoundError(
            f"{source.display()}: no {weight_format.name} weight files left after filtering "
            "(training artifacts and original/** are ignored)"
        )
    if boundary is not None:
        for file in files:
            boundary.require_inside(Path(file))
    return attrs.evolve(weight_format, files=tuple(files))


def prepare_checkpoint(location: SourceLocation, options: LoadOptions,
                       host: PluginHost | None = None) -> PreparedCheckpoint:
    """Resolve, detect, filter and read the config: step 1 of every load.

    Runs in a session whose host is ``host`` (when given), so a plugin that calls
    back into the hooks (the core's ``dummy`` format) reaches the same plugins.
    """
    location = source_location(location)
    if host is not None and current_session().host is not host:
        with use_plugin_host(host):
            return prepare_checkpoint(location, options, host)
    source = _hooks.resolve_source(location, options, host)
    weight_format = filter_weight_files(source, _hooks.detect_format(source, options.load_format, host))
    hf_config = _hooks.read_config(source, weight_format, host)
    return PreparedCheckpoint(source=source, weight_format=weight_format, hf_config=hf_config)
