"""What a model class receives when the pipeline builds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from .layers.quantization import QuantizationConfig

__all__ = ["ModelContext"]


@attrs.frozen
class ModelContext:
    """Construction arguments for every registered model class.

    ``hf_config`` is the checkpoint's configuration in Hugging Face's
    ``config.json`` shape (a GGUF plugin synthesises one from metadata); the
    model plugin parses it into its own typed config. ``quant_config`` is
    handed to each layer so a quantization plugin can choose its parameters.
    The rank and size to build for are the load session's
    (:func:`loader._session.current_session`). ``trust_remote_code`` is the
    user's consent to run the checkpoint's own modeling code (``auto_map``),
    which lives in ``source_dir``, the checkpoint's local folder (``None`` for a
    source streamed without one, such as ``s3://``).
    """

    hf_config: Mapping[str, Any]
    dtype: torch.dtype
    quant_config: QuantizationConfig | None = None
    trust_remote_code: bool = False
    source_dir: Path | None = None
