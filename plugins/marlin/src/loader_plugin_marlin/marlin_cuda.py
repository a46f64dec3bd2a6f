"""The Marlin GEMM on CUDA (compute capability 8.0+), from the optional ``cuda`` extra (``sgl-kernel``).

The layout is built here (:mod:`~loader_plugin_marlin.marlin_layout`, tested
on the CPU); the kernel itself comes from an installed package, because
compiling CUDA is not this plugin's job. ``sgl_kernel.gptq_marlin_gemm``
takes the repacked weight, permuted scales, optional packed zero points,
the sorted ``g_idx`` with its ``perm`` (act-order) and a workspace, and
computes ``x @ w.T`` in float16 or bfloat16.

Nothing here runs without a GPU: :func:`marlin_cuda_unavailable_reason`
says why, and the layer keeps another kernel. The first multiplication of
a layer on a new machine should be checked against the dequantized
reference (``tests/plugins/marlin/test_marlin_cuda.py`` does, where CUDA exists).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from loader.kernels import KernelChoice

from .marlin_layout import MarlinWeight

__all__ = ["MarlinKernel", "marlin_cuda_unavailable_reason", "marlin_kernel"]

_EXTRA = "pip install 'loader-plugin-marlin[cuda]' (sgl-kernel)"


def marlin_cuda_unavailable_reason(device: torch.device) -> str | None:
    """Why the Marlin GEMM cannot run on ``device`` (``None`` when it can)."""
    if device.type != "cuda":
        return f"the Marlin kernel runs on CUDA devices, not {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 0):
        return f"the Marlin kernel needs compute capability 8.0, found {major}.{minor}"
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        return f"no Marlin GEMM is installed: {_EXTRA}"
    return None


def _scalar_type(weight: MarlinWeight) -> Any:
    from sgl_kernel.scalar_type import scalar_types

    if weight.zeros is not None:
        return scalar_types.uint4 if weight.bits == 4 else scalar_types.uint8
    return scalar_types.uint4b8 if weight.bits == 4 else scalar_types.uint8b128


@attrs.frozen(eq=False)
class MarlinKernel:
    """One layer's Marlin weight and the workspace its GEMM needs."""

    weight: MarlinWeight
    workspace: torch.Tensor
    choice: KernelChoice

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        from sgl_kernel import gptq_marlin_gemm

        w = self.weight
        flat = x.reshape(-1, w.in_features).to(w.scales.dtype).contiguous()
        empty = torch.empty(0, dtype=torch.int32, device=x.device)
        out = gptq_marlin_gemm(
            flat, None, w.qweight, w.scales, None, w.zeros, w.g_idx if w.perm is not None else empty,
            w.perm.to(torch.int32) if w.perm is not None else empty, self.workspace, _scalar_type(w),
            flat.shape[0], w.out_features, w.in_features, is_k_full=True, use_atomic_add=False,
            use_fp32_reduce=True, is_zp_float=False,
        )
        return out.reshape(*x.shape[:-1], w.out_features).to(x.dtype)


def marlin_kernel(weight: MarlinWeight, device: torch.device) -> MarlinKernel:
    """A Marlin kernel for ``weight`` on ``device`` (check :func:`marlin_cuda_unavailable_reason` first)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    workspace = torch.zeros(sms * 4, dtype=torch.int32, device=device)
    return MarlinKernel(weight, workspace, KernelChoice("marlin"))
