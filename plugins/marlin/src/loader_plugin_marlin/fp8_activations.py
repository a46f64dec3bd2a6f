"""A layer's input rounded to FP8 the way the checkpoint's producer rounds it, for the CPU path.

An FP8 checkpoint whose config quantizes activations was calibrated (static
``input_scale``) or run (dynamic scales) with its inputs on the FP8 grid. On the
CPU the matmul itself runs on the dequantized weight (torch's FP8 matmul there is
far slower), so the input is quantized and dequantized first — what
compressed-tensors' decompressed forward (``run_compressed=False``, the reference
transformers builds on the CPU) does before every linear, and what fbgemm's
per-row quantization gives its GPU kernel:

* dynamic ``token``: one scale per row, ``max|x| / 448`` (fbgemm clamps ``max|x|`` to
  ``activation_scale_ub`` first); dynamic ``tensor``: one scale for the whole input;
  dynamic ``group``: one per row per ``group_size`` input columns;
* static: the layer's stored ``input_scale``;

then ``clamp(x / scale, ±448)`` is cast to ``float8_e4m3fn`` (round to nearest even)
and multiplied back, all in the input's dtype; a zero scale becomes that dtype's epsilon, as in compressed-tensors.
A row-parallel layer sees only its share of the input columns, so per-row and
per-tensor maxima are gathered over the tensor-parallel ranks: every rank uses
the scale the whole row would get.
"""

from __future__ import annotations

import torch

from loader.models import all_gather

from .fp8_scheme import FP8_DTYPE, FP8_MAX, ActivationQuant

__all__ = ["dynamic_input_scale", "emulated_input", "fake_quantize"]


def fake_quantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``values`` on the FP8 grid of ``scale`` (broadcast), back in ``values``' dtype."""
    return (values / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(values.dtype) * scale


def _scale_from_max(amax: torch.Tensor, acts: ActivationQuant) -> torch.Tensor:
    if acts.scale_ub is not None:
        amax = amax.clamp(max=acts.scale_ub)
    scale = amax / FP8_MAX
    return torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)


def dynamic_input_scale(values: torch.Tensor, acts: ActivationQuant, split_input: bool) -> torch.Tensor:
    """The scale of dynamic ``token`` (``[..., 1]``, per row) or ``tensor`` (``[1]``) activations of ``values``.

    :param split_input: the layer is row-parallel: maxima are gathered over the ranks.
    """
    if acts.strategy == "token":
        amax = values.abs().amax(dim=-1, keepdim=True)
        if split_input:
            amax = all_gather(amax, dim=-1).amax(dim=-1, keepdim=True)
    else:
        amax = values.abs().amax().reshape(1)
        if split_input:
            amax = all_gather(amax, dim=0).amax().reshape(1)
    return _scale_from_max(amax, acts)


def emulated_input(x: torch.Tensor, acts: ActivationQuant, input_scale: torch.Tensor | None,
                   split_input: bool) -> torch.Tensor:
    """``x`` quantized to FP8 and dequantized, computed in ``x``'s dtype as compressed-tensors does.

    :param input_scale: the stored scale of static activations (``None`` for dynamic ones).
    :param split_input: the layer is row-parallel: maxima are gathered over the ranks.
    """
    values = x
    if not acts.dynamic:
        assert input_scale is not None
        return fake_quantize(values, input_scale.to(x.dtype))
    if acts.strategy == "group":
        assert acts.group_size is not None
        groups = values.unflatten(-1, (-1, acts.group_size))
        scale = _scale_from_max(groups.abs().amax(dim=-1, keepdim=True), acts)
        return fake_quantize(groups, scale).flatten(-2)
    return fake_quantize(values, dynamic_input_scale(values, acts, split_input))
