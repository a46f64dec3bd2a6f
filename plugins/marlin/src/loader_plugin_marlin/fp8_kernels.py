"""The kernels an FP8 layer runs with, and the one chooser that picks between them from shapes and device.

``fp8_dequantized``: the weight is dequantized once after loading into the load's
dtype and multiplied with ``F.linear``; the input is first rounded to FP8 where the
checkpoint's CPU reference does that (:mod:`.fp8_activations`).
``fp8_scaled_mm``: the weight stays FP8 (half the bytes of bf16) and
``torch._scaled_mm`` multiplies it with the input quantized to FP8 — dynamic
scales per row (``token``) or per tensor, or the stored static ``input_scale``
(the largest of a fused layer's parts, as vLLM does); weight scales per tensor,
or per row (``channel``, and per-tensor parts of a fused layer that differ).

Which one: on CUDA ``fp8_scaled_mm`` from compute capability 8.9 (per-tensor
scales) or 9.0 (row-wise scales), for ``tensor``/``channel`` weight scales with
quantized activations and N, K multiples of 16; block scales, per-group
activations, weight-only checkpoints and older GPUs dequantize. On the CPU
``fp8_dequantized``: torch 2.13's CPU ``_scaled_mm`` takes these scales but is
far slower. Measured with ``benchmarks/bench_fp8_kernels.py`` (N = K = 4096,
``OMP_NUM_THREADS=2``, a fresh process per kernel, medians of 15 calls), one
token / 32 tokens: dequantized bfloat16 2.2 / 11 ms, float32 4.3 / 55 ms;
``_scaled_mm`` per-tensor 98 / 253 ms, row-wise 103 / 117 ms; the FP8 weight
upcast to bfloat16 at each call 134 / 73 ms. The dequantized weight costs 2-4x
the FP8 bytes; no CPU kernel here makes keeping FP8 pay.
``quantization_options={"kernel": "scaled_mm"}`` forces it anywhere it can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch
import torch.nn.functional as F

from loader.kernels import KernelChoice, KernelOption, choose_kernel

from .fp8_activations import dynamic_input_scale, emulated_input
from .fp8_scheme import FP8_DTYPE, FP8_MAX, ActivationQuant, Fp8Geometry, Fp8Scheme, dequantize_weight, row_scales

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["DEQUANTIZED", "KERNELS", "SCALED_MM", "DequantizedFp8Kernel", "ScaledMmFp8Kernel", "build_fp8_kernel",
           "device_capability", "plan_fp8_kernel", "scaled_mm_unsupported_reason"]

DEQUANTIZED = "fp8_dequantized"
SCALED_MM = "fp8_scaled_mm"
KERNELS = ("auto", "dequantize", "scaled_mm")
"""``quantization_options["kernel"]``: ``auto`` picks per layer; the others force one (``scaled_mm`` falls back
to ``fp8_dequantized``, with the reason, for a layer it cannot take)."""
PER_TENSOR_CAPABILITY = (8, 9)
ROWWISE_CAPABILITY = (9, 0)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device`` (``None`` for any other device)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def _needs_rowwise(scheme: Fp8Scheme, parts: int) -> bool:
    acts = scheme.activations
    return scheme.strategy == "channel" or parts > 1 or (acts is not None and acts.strategy == "token")


def scaled_mm_unsupported_reason(scheme: Fp8Scheme, geometry: Fp8Geometry,
                                 capability: tuple[int, int] | None, device_type: str) -> str | None:
    """Why ``torch._scaled_mm`` cannot run this layer on this device (``None``: it can).

    :param capability: the CUDA compute capability (ignored on other devices).
    """
    acts = scheme.activations
    if scheme.strategy == "block":
        return "block weight scales are dequantized (torch._scaled_mm takes per-tensor or row-wise scales)"
    if acts is None:
        return "the checkpoint does not quantize activations, which torch._scaled_mm needs"
    if acts.strategy == "group":
        return "per-group activation scales are not among torch._scaled_mm's (per-tensor, row-wise)"
    if device_type != "cuda":
        return None if device_type == "cpu" else f"torch._scaled_mm does not run on {device_type}"
    if geometry.rows % 16 or geometry.cols % 16:
        return (f"torch._scaled_mm needs both sizes a multiple of 16, this rank's weight is "
                f"{geometry.rows}x{geometry.cols}")
    needed = ROWWISE_CAPABILITY if _needs_rowwise(scheme, len(geometry.parts)) else PER_TENSOR_CAPABILITY
    if capability is None or capability < needed:
        kind = "row-wise" if needed == ROWWISE_CAPABILITY else "per-tensor"
        return (f"torch._scaled_mm with {kind} scales needs compute capability {needed[0]}.{needed[1]} or newer, "
                f"found {capability}")
    return None


def plan_fp8_kernel(scheme: Fp8Scheme, geometry: Fp8Geometry, requested: str, device: torch.device,
                    capability: tuple[int, int] | None) -> KernelChoice:
    """The kernel this layer gets, from its shapes, the request and the device (``capability`` on CUDA)."""
    scaled = KernelOption(SCALED_MM, scaled_mm_unsupported_reason(scheme, geometry, capability, device.type))
    dequantized = KernelOption(DEQUANTIZED)
    if requested == "dequantize":
        options = [dequantized]
    elif requested == "scaled_mm" or device.type == "cuda":
        options = [scaled]
    else:
        options = [dequantized]  # measured: see the module docstring
    return choose_kernel(options, DEQUANTIZED)


@attrs.frozen
class DequantizedFp8Kernel:
    """The weight dequantized into the load's dtype; the input rounded to FP8 first when :attr:`acts` says so.

    :ivar input_scale: each fused part's static input scale (empty for dynamic activations).
    :ivar part_rows: each part's output rows, when the parts' static input scales differ (each part's input is
        then rounded with its own scale); empty when one rounding serves every part.
    """

    weight: torch.Tensor
    input_scale: torch.Tensor
    choice: KernelChoice
    acts: ActivationQuant | None = None
    part_rows: tuple[int, ...] = ()
    split_input: bool = False

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        acts = self.acts
        x = x.to(self.weight.dtype)
        if acts is None:
            return F.linear(x, self.weight)
        if not self.part_rows:
            scale = None if acts.dynamic else self.input_scale[:1]
            return F.linear(emulated_input(x, acts, scale, self.split_input), self.weight)
        outputs = [F.linear(emulated_input(x, acts, self.input_scale[index : index + 1], self.split_input), rows)
                   for index, rows in enumerate(self.weight.split(list(self.part_rows)))]
        return torch.cat(outputs, dim=-1)


@attrs.frozen
class ScaledMmFp8Kernel:
    """The FP8 weight kept, multiplied by ``torch._scaled_mm`` with the input quantized to FP8.

    :ivar weight_scale: ``[1, N]`` row-wise, or a scalar.
    :ivar input_scale: the static input scale (a scalar; empty for dynamic activations).
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor
    choice: KernelChoice
    acts: ActivationQuant
    split_input: bool = False

    @property
    def rowwise(self) -> bool:
        return self.weight_scale.dim() == 2

    def _input_scale(self, rows: torch.Tensor) -> torch.Tensor:
        if self.acts.dynamic:
            scale = dynamic_input_scale(rows, self.acts, self.split_input)
        else:
            scale = self.input_scale.to(torch.float32)
        if self.rowwise:
            return scale.reshape(-1, 1).expand(rows.shape[0], 1).contiguous()
        return scale.reshape(())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
        scale = self._input_scale(rows)
        quantized = (rows / scale.reshape(-1, 1) if self.rowwise else rows / scale).clamp(-FP8_MAX, FP8_MAX)
        out_dtype = torch.bfloat16 if self.rowwise and x.is_cuda else torch.float32
        out = torch._scaled_mm(quantized.to(FP8_DTYPE), self.weight.t(), scale_a=scale, scale_b=self.weight_scale,
                               out_dtype=out_dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.weight.shape[0])


def build_fp8_kernel(choice: KernelChoice, scheme: Fp8Scheme, geometry: Fp8Geometry,
                     tensors: Mapping[str, torch.Tensor],
                     dtype: torch.dtype) -> DequantizedFp8Kernel | ScaledMmFp8Kernel:
    """The chosen kernel built from this rank's checkpoint tensors (named as :func:`.fp8_param_specs` says)."""
    weight, scale = tensors["weight"], tensors[scheme.scale_name]
    input_scale = tensors.get("input_scale", torch.empty(0))
    split_input = geometry.cols != geometry.input_size
    if choice.kernel == SCALED_MM:
        assert scheme.activations is not None
        if scheme.strategy == "channel":
            weight_scale = scale.to(torch.float32).reshape(1, -1).contiguous()
        elif _needs_rowwise(scheme, len(geometry.parts)):
            weight_scale = row_scales(scale, geometry).reshape(1, -1).contiguous()
        else:
            weight_scale = scale.to(torch.float32).reshape(())
        static = input_scale.to(torch.float32).amax().reshape(()) if input_scale.numel() else input_scale
        return ScaledMmFp8Kernel(weight.contiguous(), weight_scale, static, choice, scheme.activations, split_input)
    acts = scheme.activations if scheme.activations is not None and scheme.activations.emulated_on_cpu else None
    static = input_scale.to(torch.float32)
    per_part = static.numel() > 1 and not bool((static == static[0]).all())
    return DequantizedFp8Kernel(dequantize_weight(weight, scale, scheme, geometry, dtype), static, choice, acts,
                                tuple(part.length for part in geometry.parts) if per_part else (), split_input)
