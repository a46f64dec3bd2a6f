"""What the pipeline knows about a checkpoint: where it is and which format it holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from .weights import WeightStream

__all__ = ["Source", "SourceReader", "TokenizerBundle", "WeightFormat", "WeightRenaming"]


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
    """

    name: str
    files: tuple[str, ...]
    index: str | None = None
    parameter_names: bool = False
    post_processed: bool = False
    renaming: WeightRenaming | None = attrs.field(default=None, eq=False)
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
