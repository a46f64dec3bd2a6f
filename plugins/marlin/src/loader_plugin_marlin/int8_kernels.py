"""The kernels of compressed-tensors int8 layers (W8A8, W8A16), chosen per layer and device.

What the reference computes: the checkpoint's producer (llm-compressor 0.14, whose model before saving is the
one it evaluated) and ``transformers`` 5.17 with ``dequantize=True`` (the transformers llm-compressor 0.14
runs with) both run compressed-tensors' wrapped forward, which **quantizes each W8A8 layer's input** (per
token, or with the stored ``input_scale``) and multiplies the rounded input by the dequantized weight; without
that rounding a tiny Llama's logits move by 1.4 % and SmolLM2's top-1 agrees on 86 % of chat positions only.
(transformers 5.24 with compressed-tensors 0.20 drops the wrapped forward and computes weight-only.) Every CPU
kernel below therefore takes the input rounded the same way (:func:`round_input`; a fused layer whose parts
have different static input scales rounds once per part); ``int8_mm`` quantizes it itself. The weight side:

* float32 loads: the weight dequantized once (``dequantized``). Measured on a 2-core AVX-512-VNNI Xeon
  (no AMX; ``benchmarks/bench_int8_kernels.py``: OMP_NUM_THREADS=2, a fresh process per kernel, five
  interleaved rounds, medians; K=2048, N=8192; load average ~3 from other work), milliseconds for M=1 / M=128
  tokens: dequantized fp32 5.9 / 123, ``_weight_int8pack_mm`` fp32 32 / 3182, ``_int_mm`` with per-token
  int8 activations 8.0 / 76, dequantized bf16 8.1 / 25, ``_weight_int8pack_mm`` bf16 8.0 / 93. torch's
  int8 weight kernel is 5x (decode) to 26x (prefill) slower than float32 ``F.linear`` in float32, so float32
  layers hold the float32 weight.
* bfloat16 / float16 loads of W8A8 checkpoints: ``int8_mm`` (below). On the 1 GB Llama
  (``benchmarks/bench_quantized_formats.py``, bf16, 2 threads, AMD EPYC with AVX512-VNNI; RESULTS.md) it
  prefills 128 tokens in 0.75x the bf16 model's time (``int8pack`` 2.5x, the dequantized bf16 weight 1.05x)
  and decodes in 0.50x (``int8pack`` 0.54x, dequantized 1.07x), at one byte per weight; since every kernel
  takes the same rounded input, it computes what the others do. W8A16 (no activation scheme): ``int8pack``
  (channel and tensor scales; decode ties, one byte per weight). Grouped weights take the marlin chooser
  (the int8 planes or groups, else the dequantize fallback).

``int8_mm`` (asked for by ``quantization_options={"kernel": "int8_mm"}``, and ``auto`` on CUDA) computes what
vLLM and compressed-tensors' own quantized forward compute: the input quantized to int8 (dynamic: per token,
``amax / 127.5`` symmetric, ``(max - min) / 255`` with a zero point asymmetric, 0 always representable; static:
the stored per-tensor scale and zero point), ``torch._int_mm`` with the int8 weight (int32 accumulation, exact),
then both scales; an input zero point is corrected with the weight's row sums. It takes symmetric channel or
tensor weights; on CUDA rows are padded to 17 (``_int_mm`` wants more than 16) and K, N must be multiples of 8.
vLLM runs the same math through its CUTLASS ``cutlass_scaled_mm`` extension, which this plugin does not ship;
torch's ``_int_mm`` is the kernel torch has (the CUDA path is chosen by device and not yet run on a GPU here).
"""

from __future__ import annotations

import attrs
import torch

from loader.kernels import KernelChoice, KernelOption, choose_kernel
from loader.models import all_gather

from .int8_scheme import Int8Activations
from .kernel_paths import DenseBudget, with_paths
from .kernels import FALLBACK, DequantizeKernel, LayerKernel
from .kernels import choose_kernel as choose_packed
from .quantized_weight import QuantizedWeight

__all__ = ["DequantizedKernel", "Int8MatmulKernel", "choose_int8_kernel", "int8_mm_reason", "plan_int8_kernel",
           "quantize_input", "round_input", "wanted_int8_kernel"]

_CUDA_MIN_ROWS = 17


@attrs.frozen(eq=False)
class DequantizedKernel:
    """The weight dequantized once, in the load's dtype, then ``F.linear``."""

    weight: torch.Tensor
    choice: KernelChoice

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


@attrs.frozen(eq=False)
class Int8MatmulKernel:
    """int8 activations times int8 weights (``torch._int_mm``), both scales applied to the int32 result.

    :ivar codes: int8 ``[N, K]`` (multiplied as its transpose, the column-major ``[K, N]`` cuBLAS wants).
    :ivar scales: float32 ``[N]``.
    :ivar row_sums: int32 ``[N]``, each output's code sum (the input zero point's correction).
    :ivar input_scale: float32 ``[1]`` for static activations (empty for dynamic ones).
    :ivar input_zero_point: float32 ``[1]`` (0 for symmetric static activations; empty for dynamic ones).
    :ivar split_input: the layer is row-parallel over several ranks: dynamic scales are gathered over them.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    row_sums: torch.Tensor
    input_scale: torch.Tensor
    input_zero_point: torch.Tensor
    symmetric_input: bool
    choice: KernelChoice
    split_input: bool = False

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.codes.shape[1]).to(torch.float32)
        codes, scale, zero = quantize_input(flat, self.input_scale, self.input_zero_point, self.symmetric_input,
                                            self.split_input)
        rows = codes.shape[0]
        if codes.device.type == "cuda" and rows < _CUDA_MIN_ROWS:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, _CUDA_MIN_ROWS - rows))
        products = torch._int_mm(codes, self.codes.t())[:rows].to(torch.float32)
        if self.input_scale.numel() == 0 and self.symmetric_input:
            out = products * scale * self.scales
        else:
            out = (products - zero * self.row_sums.to(torch.float32)) * scale * self.scales
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def _row_extremes(x: torch.Tensor, split_input: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``(min, max)``, over every rank's columns when a row-parallel layer splits them."""
    low, high = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    if split_input:
        low = all_gather(low, dim=-1).amin(-1, keepdim=True)
        high = all_gather(high, dim=-1).amax(-1, keepdim=True)
    return low, high


def quantize_input(x: torch.Tensor, static_scale: torch.Tensor, static_zero: torch.Tensor,
                   symmetric: bool, split_input: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(int8 codes, scale, zero point)`` of ``x [..., K]`` (float32) as compressed-tensors quantizes a layer's
    input: the stored per-tensor scale and zero point (``static_scale`` non-empty), else per token — symmetric
    ``amax / 127.5``, asymmetric ``(max - min) / 255`` with 0 representable. ``split_input``: the layer is
    row-parallel, so each row's extremes are gathered over the ranks (every rank uses the whole row's scale)."""
    if static_scale.numel():
        scale, zero = static_scale, static_zero
    elif symmetric:
        low, high = _row_extremes(x, split_input)
        scale = torch.maximum(-low, high) / 127.5
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero = torch.zeros_like(scale)
    else:
        low, high = _row_extremes(x, split_input)
        low, high = low.clamp(max=0), high.clamp(min=0)
        scale = (high - low) / 255
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero = torch.round(-128 - low / scale).clamp(-128, 127)
    codes = torch.round(torch.clamp(x / scale + zero, -128, 127)).to(torch.int8)
    return codes, scale, zero


def round_input(x: torch.Tensor, static_scale: torch.Tensor, static_zero: torch.Tensor,
                symmetric: bool, split_input: bool = False) -> torch.Tensor:
    """``x`` rounded to the int8 grid its layer's activations are quantized to, back in ``x``'s dtype: what
    compressed-tensors' forward multiplies a W8A8 layer's dequantized weight with."""
    codes, scale, zero = quantize_input(x.to(torch.float32), static_scale, static_zero, symmetric, split_input)
    return ((codes.to(torch.float32) - zero) * scale).to(x.dtype)


def int8_mm_reason(activations: Int8Activations | None, symmetric: bool, group_size: int, k: int, n: int,
                   device: torch.device) -> str | None:
    """Why ``int8_mm`` cannot take a layer of this scheme and shape on ``device``, or ``None``."""
    if activations is None:
        return "the checkpoint does not quantize activations (W8A16): int8_mm needs their scheme"
    if not symmetric or group_size != -1:
        return "int8_mm takes symmetric channel or tensor weights (one scale per output row)"
    if device.type == "cuda" and (k % 8 or n % 8):
        return f"torch._int_mm on CUDA needs K and N multiples of 8, found K={k}, N={n}"
    return None


def wanted_int8_kernel(requested: str, has_activations: bool, dtype: torch.dtype, device: torch.device) -> str:
    """The kernel ``requested`` means for this load: ``auto`` is ``int8_mm`` for W8A8 checkpoints on CUDA (vLLM's
    path) and for bf16/fp16 CPU loads (measured fastest there, see the module doc), else ``dequantized`` for
    float32 CPU loads and ``int8pack`` for W8A16 ones."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "int8_mm" if has_activations else "dequantized"
    if dtype == torch.float32:
        return "dequantized"
    return "int8_mm" if has_activations else "int8pack"


def plan_int8_kernel(activations: Int8Activations | None, *, symmetric: bool, group_size: int, k: int, n: int,
                     requested: str, dtype: torch.dtype, device: torch.device,
                     packed_plan: KernelChoice) -> KernelChoice:
    """What :func:`choose_int8_kernel` will choose for a layer of this shape, from shapes alone.

    :param packed_plan: the marlin chooser's plan for the weight, which ``int8pack`` layers follow.
    """
    kernel = wanted_int8_kernel(requested, activations is not None, dtype, device)
    if kernel == "int8pack":
        return packed_plan
    if kernel == "int8_mm":
        reason = int8_mm_reason(activations, symmetric, group_size, k, n, device)
        return choose_kernel([KernelOption("int8_mm", reason)], "dequantized")
    return KernelChoice(kernel, f"quantization_options kernel={requested!r}" if requested == kernel else None)


def choose_int8_kernel(weight: QuantizedWeight, activations: Int8Activations | None, input_qparams: tuple[float, float]
                       | None, requested: str, dtype: torch.dtype) -> LayerKernel:
    """The layer's kernel: ``requested`` (or :func:`wanted_int8_kernel`), else ``dequantized`` with the reason.

    :param input_qparams: ``(scale, zero point)`` of static activations, combined over fused parts.
    """
    device = weight.codes.device
    kernel = wanted_int8_kernel(requested, activations is not None, dtype, device)
    if kernel == "int8pack":  # W8A16 on a bf16/fp16 load: the packed kernels' path per token count
        return with_paths(choose_packed(weight, "int8pack", dtype), dtype, exact=False, budget=DenseBudget(0))
    if kernel == FALLBACK:
        return DequantizeKernel(weight, KernelChoice(FALLBACK, "quantization_options kernel='dequantize'"))
    choice = KernelChoice(kernel, "quantization_options kernel='dequantized'" if requested == kernel else None)
    if kernel == "int8_mm":
        reason = int8_mm_reason(activations, weight.is_symmetric(), weight.group_size, weight.in_features,
                                weight.out_features, device)
        choice = choose_kernel([KernelOption("int8_mm", reason)], "dequantized")
    if choice.kernel == "int8_mm":
        assert activations is not None
        return _int8_mm(weight, activations, input_qparams, choice)
    return DequantizedKernel(weight.dequantize(dtype), choice)


def _int8_mm(weight: QuantizedWeight, activations: Int8Activations, input_qparams: tuple[float, float] | None,
             choice: KernelChoice) -> Int8MatmulKernel:
    codes = (weight.codes.t().to(torch.int16) - 128).to(torch.int8).contiguous()
    static = torch.tensor([] if input_qparams is None else [input_qparams[0]], dtype=torch.float32)
    zero = torch.tensor([] if input_qparams is None else [input_qparams[1]], dtype=torch.float32)
    return Int8MatmulKernel(codes, weight.scales[0].to(torch.float32).contiguous(),
                            codes.to(torch.int32).sum(-1), static.to(codes.device), zero.to(codes.device),
                            activations.symmetric, choice)
