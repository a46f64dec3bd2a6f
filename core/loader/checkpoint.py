"""What the pipeline knows about a checkpoint: where it is and which format it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

__all__ = ["Source", "TokenizerBundle", "WeightFormat"]


@attrs.frozen
class Source:
    """A checkpoint location resolved to something readable.

    ``location`` is what the user passed; ``path`` is the local folder or file
    it resolved to (for remote sources that stream without a local copy, such
    as ``s3://``, ``path`` is ``None`` and ``uri`` holds the remote prefix).
    """

    location: str
    path: Path | None
    uri: str | None = None
    revision: str | None = None

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
    """

    name: str
    files: tuple[str, ...]
    index: str | None = None
    parameter_names: bool = False
    post_processed: bool = False
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
