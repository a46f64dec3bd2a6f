"""What the pipeline knows about a checkpoint: where it is, which format it holds, how to read its side files.

The public home of everything a format or source plugin describes a checkpoint
with: :class:`Source` (and its :class:`SourceReader`), :class:`WeightFormat`
(and its :class:`WeightRenaming`), :class:`TokenizerBundle`, the load's
:class:`LoadOptions`, the readers of ``config.json`` and the tokenizer (which
take bytes as well as paths, so a remote source reuses them) and the
training-artifact rule the core applies to every source.

It is also the one home of the checks every reader of a file format shares, so
no plugin keeps a copy with fewer rules: the safetensors header parser
(:func:`read_safetensors_header` through any ranged reader, a local file's
:func:`read_safetensors_file_header`, the dtype table) and the sharded-state
layout (:func:`read_sharded_marker`, :func:`sharded_part_names`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from ._json_files import MAX_JSON_BYTES, read_json_object
from ._model_folder import side_file
from ._options import DTYPES, LoadOptions, parse_dtype
from ._safetensors_dtypes import DTYPES as SAFETENSORS_DTYPES
from ._safetensors_dtypes import SafetensorsDType
from ._safetensors_header import MAX_HEADER_BYTES as SAFETENSORS_MAX_HEADER_BYTES
from ._safetensors_header import RangeReader, SafetensorsHeader, SafetensorsTensorInfo
from ._safetensors_header import parse_header as parse_safetensors_header
from ._safetensors_header import read_file_header as read_safetensors_file_header
from ._safetensors_header import read_header as read_safetensors_header
from ._sharded_layout import MARKER as SHARDED_STATE_MARKER
from ._sharded_layout import ShardedLayout
from ._sharded_layout import part_names as sharded_part_names
from ._sharded_layout import read_marker as read_sharded_marker
from .errors import ConfigError, LoadError

if TYPE_CHECKING:
    from .weights import WeightStream

__all__ = [
    "DTYPES",
    "MAX_JSON_BYTES",
    "SAFETENSORS_DTYPES",
    "SAFETENSORS_MAX_HEADER_BYTES",
    "SHARDED_STATE_MARKER",
    "TRAINING_ARTIFACTS",
    "FileBytes",
    "LoadOptions",
    "RangeReader",
    "SafetensorsDType",
    "SafetensorsHeader",
    "SafetensorsTensorInfo",
    "ShardedLayout",
    "Source",
    "SourceReader",
    "TokenizerBundle",
    "WeightFormat",
    "WeightRenaming",
    "is_training_artifact",
    "load_hf_tokenizer",
    "parse_dtype",
    "parse_safetensors_header",
    "read_json_object",
    "read_safetensors_file_header",
    "read_safetensors_header",
    "read_sharded_marker",
    "read_source_file",
    "sharded_part_names",
    "side_file",
]

TRAINING_ARTIFACTS = ("training_args.bin", "optimizer.*", "scheduler.pt", "scaler.pt", "rng_state*")


class WeightRenaming(Protocol):
    """A format's renaming step: checkpoint names (and layouts) into the Hugging Face names models map from.

    A detection plugin that recognises a layout with names of its own (Mistral's
    native ``layers.0.attention.wq.weight``) puts one on the :class:`WeightFormat`
    it returns; the core applies it to whatever stream reads the files, before
    the duplicate-name check, so a tensor present under both names is refused.
    """

    def __call__(self, weights: WeightStream, hf_config: Mapping[str, Any]) -> WeightStream:
        """The renamed stream; ``hf_config`` is the load's configuration (head counts and the like)."""
        ...


@runtime_checkable
class SourceReader(Protocol):
    """How the core lists and reads the small files of a source with no local folder.

    A remote-source plugin (``s3://``, an in-memory store) hands one to its
    :class:`Source`; the core then reads ``config.json``, the tokenizer files and
    the weight index through it and applies the index and training-artifact
    filtering itself, as for a local folder. Names are relative POSIX paths
    inside the checkpoint (``"config.json"``, ``"original/params.json"``).
    """

    def list_files(self) -> Sequence[str]:
        """Every file of the checkpoint, by relative name."""
        ...

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """The file's bytes, ``None`` if there is no such file; may stop after ``limit + 1`` bytes."""
        ...


@attrs.frozen
class Source:
    """A checkpoint location resolved to something readable.

    ``location`` is what the user passed; ``path`` is the local folder or file
    it resolved to (for remote sources that stream without a local copy, such
    as ``s3://``, ``path`` is ``None``, ``uri`` holds the remote prefix and
    ``reader`` lists and reads its files). A remote source's weight files and
    index are named ``uri + "/" + relative name`` in :class:`WeightFormat`.
    """

    location: str
    path: Path | None
    uri: str | None = None
    revision: str | None = None
    reader: SourceReader | None = attrs.field(default=None, eq=False)

    def file_uri(self, name: str) -> str:
        """How a remote source's file ``name`` appears in :attr:`WeightFormat.files`."""
        return f"{(self.uri or self.location).rstrip('/')}/{name}"

    def relative_name(self, file: str) -> str | None:
        """The relative name of a remote file (the inverse of :meth:`file_uri`), ``None`` if outside."""
        prefix = f"{(self.uri or self.location).rstrip('/')}/"
        return file[len(prefix):] if file.startswith(prefix) else None

    def display(self) -> str:
        """How messages refer to this source."""
        return str(self.path) if self.path is not None else (self.uri or self.location)

    @property
    def directory(self) -> Path | None:
        """The folder holding the checkpoint (the file's parent for a single file)."""
        if self.path is None:
            return None
        return self.path if self.path.is_dir() else self.path.parent


@attrs.frozen
class WeightFormat:
    """A format chosen for a source and the files that hold its weights.

    ``name`` is the format plugin's name for it (``"safetensors"``, ``"pt"``,
    ``"gguf"``, ...). ``files`` are paths or URIs in load order. ``index`` is
    the index file whose ``weight_map`` says which files are part of the model
    (the core keeps only those and fails if one is missing).

    Two flags let a format say what its tensors are, so the pipeline names no
    format: ``parameter_names`` when they are named by the model's own
    parameters (loaded by name, with no name mapping and no quantization
    wrapping: the core's ``dummy`` and ``sharded_state``), ``post_processed``
    when they are already in their final layout (no post-processing runs).
    ``renaming`` is the format's renaming step (see :class:`WeightRenaming`), if any.
    ``default_dtype`` is the dtype a load uses when the caller names none
    (``"bfloat16"``; GGUF says ``"auto"``: its files carry their own float types).
    """

    name: str
    files: tuple[str, ...]
    index: str | None = None
    parameter_names: bool = False
    post_processed: bool = False
    renaming: WeightRenaming | None = attrs.field(default=None, eq=False)
    default_dtype: str = "bfloat16"
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)


@attrs.frozen
class TokenizerBundle:
    """A ready tokenizer plus what generation needs around it.

    ``tokenizer`` is a ``tokenizers.Tokenizer``; ``chat_template`` a Jinja2
    template in Hugging Face's convention.
    """

    tokenizer: Any
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    eos_token_ids: tuple[int, ...] = ()
    add_bos_token: bool = False


def is_training_artifact(name: str) -> bool:
    """Whether a file (by its base name) is training state saved beside the weights, not a weight file."""
    base = PurePosixPath(name).name
    return any(fnmatch.fnmatchcase(base, pattern) for pattern in TRAINING_ARTIFACTS)


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


FileBytes = Callable[[str], "bytes | None"]
"""Reads a checkpoint's small file by relative name: its bytes, or ``None`` when there is none."""


def _folder_bytes(folder: Path) -> FileBytes:
    def read(name: str) -> bytes | None:
        path = side_file(folder, name)
        return path.read_bytes() if path is not None else None

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
