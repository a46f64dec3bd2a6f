"""The user's request to :func:`loader.load_model`, validated once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "MODEL_IMPLS", "LoadOptions", "check_model_impl", "parse_dtype"]

DTYPES = ("float32", "float16", "bfloat16")
MODEL_IMPLS = ("auto", "native", "transformers")
"""``model_impl`` values, as vLLM's ``--model-impl``: ``auto`` prefers a native class and falls back,
``native`` never falls back, ``transformers`` always uses the fallback."""


def check_model_impl(value: Any) -> str:
    """Return ``value`` if it is one of :data:`MODEL_IMPLS`, else raise naming it."""
    if isinstance(value, str) and value in MODEL_IMPLS:
        return value
    raise UnsupportedError(f"model_impl {value!r} is not supported; use one of {', '.join(MODEL_IMPLS)}")


def parse_dtype(value: Any) -> torch.dtype:
    """Turn ``"bfloat16"``/``"bf16"``/``torch.bfloat16`` into a torch dtype, or raise."""
    import torch

    if isinstance(value, torch.dtype):
        if value in (torch.float32, torch.float16, torch.bfloat16):
            return value
        raise UnsupportedError(f"dtype {value} is not supported; use one of {', '.join(DTYPES)}")
    aliases = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    }
    if isinstance(value, str) and value.lower() in aliases:
        return aliases[value.lower()]
    raise UnsupportedError(f"dtype {value!r} is not supported; use one of {', '.join(DTYPES)}")


def _options_dict(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of the user's options mapping (``None`` is none), so changing theirs later changes no load."""
    return dict(value or {})


def _files(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class LoadOptions:
    """Everything a load was asked to do, and what the core resolved about it before plugins are asked.

    The rank, size, dtype and device of the load in progress are its session's
    (:func:`loader._session.current_session`); ``dtype`` here is the request
    (evolved to the resolved dtype once ``"auto"`` is read from the config).
    The fields from :attr:`dtype_auto` on are filled by the core, never by the
    user: :attr:`dtype_auto`, :attr:`weight_format` and :attr:`weight_files`
    once the checkpoint is prepared (a quantization plugin chooses a method from
    them, and plans layers from a format's own headers), :attr:`headers_only`
    for ``loader inspect``.
    """

    dtype: torch.dtype
    device: torch.device
    load_format: str = "auto"
    """``"auto"``, ``"dummy"`` or a format plugin's name."""
    quantization: str | None = None
    """A quantization plugin's method name, or ``None`` to use what the checkpoint declares."""
    revision: str | None = None
    """The Hub revision (branch, tag or commit) of a Hub id."""
    model_impl: str = "auto"
    """One of :data:`MODEL_IMPLS`."""
    enable_expert_parallel: bool = False
    """Place whole experts of a mixture-of-experts layer on ranks (expert parallel size = tensor parallel size)
    instead of splitting every expert's intermediate dimension (vLLM's ``--enable-expert-parallel``)."""
    trust_remote_code: bool = False
    """Whether a checkpoint's own modeling code (``auto_map`` in ``config.json``) may run, as in vLLM and
    ``transformers``; without it such a checkpoint is refused before any of its files runs."""
    quantization_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_options_dict, hash=False)
    """The user's options for the quantization method (``load_model(quantization_options=...)``,
    ``--quantization-option KEY=VALUE``); empty when none were given. The method's plugin checks them."""
    format_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_options_dict, hash=False)
    """The user's options for the weight format (``load_model(format_options=...)``, ``--format-option
    KEY=VALUE``); empty when none were given. The format's plugin checks them."""
    dtype_auto: bool = False
    """Whether the dtype was asked for as ``"auto"`` (by the user, or by the format's
    :attr:`~loader.checkpoint.WeightFormat.default_dtype` when none was named): GGUF then keeps blocks packed."""
    weight_format: str | None = None
    """The chosen weight format's name, once the checkpoint is prepared (``None`` before)."""
    weight_files: tuple[str, ...] = attrs.field(default=(), converter=_files)
    """The chosen format's files (local paths or URIs), once the checkpoint is prepared (empty before)."""
    headers_only: bool = False
    """``True`` when the caller reads only names, shapes and dtypes (``loader inspect``): a source or format
    that would fetch remote bytes reads headers only (yield :class:`~loader.weights.HeaderOnlyTensor`
    handles)."""
