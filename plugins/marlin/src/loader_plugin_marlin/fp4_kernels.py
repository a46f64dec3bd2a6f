"""Which kernel an FP4 layer runs with, and which one vLLM would pick on a GPU of a given capability.

On the CPU there is no FP4 matmul: the codes and scales are decoded once at
load into the load's dtype (``dequantized``) and multiplied with ``F.linear``
(inputs first rounded to NVFP4 where the checkpoint quantizes activations and
its reference does: :mod:`.fp4_activations`).

On CUDA vLLM picks, for NVFP4 and MXFP4 linears:

* ``cutlass_fp4`` — FP4 x FP4 tensor-core GEMM (``cutlass_scaled_fp4_mm``), from
  compute capability 10.0 (Blackwell), for NVFP4 checkpoints whose activations
  are quantized too (W4A4: ModelOpt ``NVFP4``, compressed-tensors ``NVFP4``);
* ``marlin_fp4`` — the Marlin kernel with FP4 weights and 16-bit activations,
  from compute capability 8.0, for weight-only checkpoints (NVFP4A16, MXFP4A16)
  and for W4A4 checkpoints below 10.0 (activations kept in 16 bits);
* nothing below 8.0.

This plugin has neither GEMM yet, so on CUDA the layer is dequantized as on the
CPU and its record names the kernel vLLM would have used (:func:`cuda_fp4_choice`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loader.kernels import KernelChoice, KernelOption, choose_kernel

if TYPE_CHECKING:
    from .fp4_format import Fp4Scheme

__all__ = ["CUTLASS_FP4", "DEQUANTIZED", "MARLIN_FP4", "cuda_fp4_choice", "device_capability", "plan_fp4_kernel"]

DEQUANTIZED = "dequantized"
MARLIN_FP4 = "marlin_fp4"
CUTLASS_FP4 = "cutlass_fp4"
CUTLASS_CAPABILITY = (10, 0)
MARLIN_CAPABILITY = (8, 0)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device`` (``None`` for any other device)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def _shown(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def cuda_fp4_choice(scheme: Fp4Scheme, capability: tuple[int, int], *,
                    activations_quantized: bool) -> KernelChoice:
    """The kernel vLLM would run this layer with on a GPU of ``capability``, and why that one.

    :param activations_quantized: the checkpoint quantizes activations to FP4 as well (W4A4).
    """
    kind = scheme.kind.upper()
    if capability >= CUTLASS_CAPABILITY and scheme.kind == "nvfp4" and activations_quantized:
        return KernelChoice(CUTLASS_FP4, f"{kind} weights and activations, compute capability "
                                         f"{_shown(capability)} >= 10.0: FP4 tensor-core GEMM")
    if capability >= MARLIN_CAPABILITY:
        why = ("weight-only checkpoint" if not activations_quantized else
               "FP4 activations need compute capability 10.0; activations kept in 16 bits")
        return KernelChoice(MARLIN_FP4, f"{kind} weights, 16-bit activations ({why}), compute capability "
                                        f"{_shown(capability)} >= 8.0")
    return KernelChoice(DEQUANTIZED, f"no FP4 GPU kernel below compute capability 8.0 (found "
                                     f"{_shown(capability)})")


def plan_fp4_kernel(scheme: Fp4Scheme, device_type: str, capability: tuple[int, int] | None, dtype: torch.dtype,
                    *, activations_quantized: bool = False) -> KernelChoice:
    """This layer's record: ``dequantized`` into ``dtype``, with why no FP4 kernel takes it on this device.

    :param capability: the CUDA compute capability (``None`` off CUDA).
    """
    dtype_name = str(dtype).removeprefix("torch.")
    if device_type == "cuda" and capability is not None:
        wanted = cuda_fp4_choice(scheme, capability, activations_quantized=activations_quantized)
        if wanted.kernel == DEQUANTIZED:
            reason = f"{wanted.reason}; decoded once at load into {dtype_name}"
        else:
            reason = (f"vLLM would use {wanted.kernel} ({wanted.reason}); this plugin has no FP4 GEMM, the "
                      f"weight is decoded once at load into {dtype_name}")
    else:
        reason = (f"no FP4 matmul on {device_type}: the E2M1 codes and {scheme.scale_type} scales are decoded "
                  f"once at load into {dtype_name}")
    if scheme.input_applied:
        reason += f"; inputs rounded to NVFP4 per group of {scheme.group_size} as compressed-tensors' reference does"
    return choose_kernel([KernelOption(scheme.kind, reason)], DEQUANTIZED, dtype=dtype_name)
