"""What a GGUF load asks of the packed method (its ``format_options``, the dtype the kernel computes in), and the
names its reports use.

A leaf: the entry point, the config, the methods and the bundle's keys all read these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loader.errors import UnsupportedError

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions

__all__ = ["FALLBACK", "KERNEL_DTYPES", "METHOD_NAME", "NO", "YES", "dtype_name", "format_option",
           "kernel_dtype_for", "kernel_dtype_requested", "packing_requested", "yes_no_option"]

METHOD_NAME = "gguf"
FALLBACK = "dequantized"
"""The kernel of a layer no packed kernel takes: its weight dequantized at load, the reason recorded."""
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes the int4 kernel is fast in."""
YES, NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def format_option(options: LoadOptions, key: str) -> str | None:
    """``format_options[key]`` as lower-case text (``None`` when not given)."""
    value = options.format_options.get(key)
    return None if value is None else str(value).strip().lower()


def yes_no_option(options: LoadOptions, key: str) -> bool | None:
    """``format_options[key]`` as a yes/no value (``None`` when not given); anything else is refused by name."""
    text = format_option(options, key)
    if text is None:
        return None
    if text not in YES + NO:
        raise UnsupportedError(f"format option {key}={text!r} is not a yes/no value; use true or false")
    return text in YES


def packing_requested(options: LoadOptions) -> bool:
    """Whether a GGUF load that names no quantization keeps its blocks packed.

    Yes on the CPU when the dtype is ``"auto"`` (GGUF's default: float32
    activations, the linears through the bfloat16 kernel) or one the kernel
    computes in (bfloat16, float16). No when float32 is asked for by name, on
    another device, or with ``format_options={"dequantize": True}`` (CLI:
    ``--format-option dequantize=true``): the weights are dequantized as before.
    """
    text = format_option(options, "dequantize") or "false"
    if text not in YES + NO:
        raise UnsupportedError(f"format option dequantize={text!r} is not a yes/no value; use true or false")
    if text in YES or options.device.type != "cpu":
        return False
    return options.dtype_auto or options.dtype in KERNEL_DTYPES


def kernel_dtype_for(load_dtype: torch.dtype) -> torch.dtype:
    """The int4 kernel's default dtype for a load: the load's own when the kernel is fast in it, else bfloat16."""
    return load_dtype if load_dtype in KERNEL_DTYPES else torch.bfloat16


def kernel_dtype_requested(options: LoadOptions) -> torch.dtype | None:
    """``format_options={"kernel_dtype": "float32"}``: the int4 kernel computes in float32.

    Far slower than its bfloat16 path, but its weight is gguf-py's
    dequantization (wherever the zero point is exact in float32) and its
    outputs are float32. ``None``: bfloat16 (float16 for a float16 load).
    """
    text = format_option(options, "kernel_dtype")
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if text is None:
        return None
    if text not in choices:
        raise UnsupportedError(f"format option kernel_dtype={text!r} is not supported; use one of "
                               f"{', '.join(choices)}")
    return choices[text]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as load reports name dtypes."""
    return str(dtype).removeprefix("torch.")
