"""GGUF Q4_0 / Q4_1 / Q4_K (and Q8_0) weights stay packed on the CPU (torch's int4 kernel).

Chosen by default for a GGUF load on the CPU (see :func:`~.options.packing_requested`),
or always with ``quantization="gguf"``. Dequantized instead, a GGUF file
becomes floats at load time (SmolLM2 Q4_1: 97 MB of blocks become 538 MB of
float32, and writing that fresh memory is most of the load). Packed, each
parallel linear layer keeps its blocks: the layer's own ``weight_loader``
splits fused tensors (``qkv_proj``, ``gate_up_proj``) and narrows to this rank
as for every method, and the part handed to :meth:`GGUFLinearMethod._record`
is only remembered (nothing is read). After loading, every part of the layer
is decoded from its blocks into codes, scales and biases (:mod:`.q4_blocks`;
llama.cpp's q/k rotary interleave is undone on the block rows) and packed by
:func:`loader.kernels.pack_int4` (:mod:`.linear_packing`) — Q4_0/Q4_1 by
:func:`~.half_split.pack_int4_half_split_parts` straight from the blocks'
nibbles (unpacking every code to a byte first cost much of a load). A Q8_0 layer keeps its int8 codes as two int4
planes of the same kernel (``int4x2``, :func:`loader.kernels.pack_int8_grouped`:
``c d = (h - 8) 16d + (l - 8) d + 8d`` for the codes' high and low nibbles),
a byte a value where dequantized bfloat16 holds two.

A layer falls back to the dequantized weight, with the reason recorded in
the load report, when its parts are another block type (Q5_x, Q6_K, F16, ...:
torch's int8 weight-only kernel ``_weight_int8pack_mm`` takes one scale per
output row, which cannot express their per-16/32-value scales exactly, and
the int4 kernel's groups are 32 wide), a TP split cuts a block, the kernel
refuses the shape, or the target device is not the CPU — one layer at a
time, so a Q4_K_M-style file mixing types keeps what it can packed. A fused
layer whose parts need different kernels (a Q6_K ``v`` beside Q4_K ``q`` and
``k``, Q8_0 beside Q4) keeps each run of consecutive parts on its own kernel
(:mod:`.segments`, kernel ``int4+dequantized`` / ``int4+int4x2``): one
call per segment, the outputs side by side. With ``dtype="auto"`` a fallback layer of
quantized blocks holds the kernel's dtype (bfloat16) rather than float32
(:attr:`~.config.GGUFQuantConfig.dense_dtype`; float tensors keep the layer's dtype).
Every reason is decided from block types and shapes before a block is read
(:mod:`.decide`), so ``loader inspect --layers`` plans each layer from the
header alone (:meth:`GGUFLinearMethod.layer_plan`, :mod:`.plan`).

What a packing call makes is kept on disk between loads (:class:`loader.kernels.PackedBundle`, keyed by
:mod:`.bundle_keys`; :meth:`~.config.GGUFQuantConfig.cached_unit`): a later load of the same file maps the
bytes the first one packed instead of packing them into fresh memory again.

The kernel computes in bfloat16 (float16 when the load dtype is float16): in
float32 it is far slower (``format_options={"kernel_dtype":
"float32"}`` asks for it). :meth:`GGUFLinearMethod.apply` casts the
activations to the kernel's dtype and the result back, so a float32 load
(``dtype="auto"``, GGUF's default) keeps its residual stream, norms, attention
and head in float32.

Tensor parallelism: a packed row-parallel layer (``o_proj``, ``down_proj``)
at tp > 1 keeps this rank's output rows over every input column, not its
input columns: :meth:`GGUFLinearMethod.apply` gathers the split input and
returns its rows padded with zeros, so the layer's all-reduce adds each
output to zeros and tp > 1 computes what tp=1 does (the kernel computes a row
the same whichever rows it holds); summing the ranks' bfloat16 partial
products instead is not equal to tp=1. Rows the kernel refuses (no multiple of
16 a rank) keep the columns, as other methods do.

Exactness: the packed weight is ``(q - 8) * s + z`` in the kernel dtype, from
the file's own block fields: ``s = d``, ``z = bias + 8 d`` (Q4_K: ``s = d sc``,
``z = -dmin m + 8 d sc``), computed in float32. With float32 scales the
kernel's weight is bit-equal to gguf-py's dequantization wherever ``z`` is
exact in float32 — every Q4_0/Q4_1 group of real files, and Q4_K's unless
``dmin m`` and ``8 d sc`` lie many binades apart — and within that one
rounding elsewhere. With bfloat16 scales (what runs by default) it is ``(q -
8) bf16(s) + bf16(z)``; for Q4_0 (``z = 0``) that is gguf-py's dequantization
with ``d`` rounded to bfloat16 (``tests/plugins/gguf/packed/test_linear_method.py``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import torch

from loader.errors import UnsupportedError
from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    KernelChoice,
    TokenPlan,
    paths_from_shapes,
    run_planned,
)
from loader.layers import LinearBase, LinearMethodBase, LinearShape, ParamLayout, RowParallelLinear, set_param_layout
from loader.models import all_gather, current_session
from loader.weights import RowPermutedTensor

from ..format.tensors import GGUFTensor
from . import linear_packing
from .decide import Decision, decide, dense_dtype
from .linear_state import GGUFLayerState, LayerSegment, RankSplit
from .options import FALLBACK, METHOD_NAME, dtype_name, kernel_dtype_for
from .plan import fill_from_header
from .segments import apply_segments, current_segments, keep_segments, merged_plans

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import NarrowedPart

    from .config import GGUFQuantConfig

__all__ = ["GGUFLinearMethod"]


class GGUFLinearMethod(LinearMethodBase):
    """One parallel linear layer of a GGUF file: parts remembered, then packed to int4 or dequantized."""

    layer_state_attr = "gguf_state"
    process_weights_concurrently = True  # reads its own parts, writes its own buffers; packs in C or torch ops

    def __init__(self, config: GGUFQuantConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        rows, cols = shape.output_size_per_partition, shape.input_size_per_partition
        linear = cast("LinearBase", layer)
        split = None
        if isinstance(linear, RowParallelLinear) and linear.tp_size > 1:
            split = RankSplit(linear.tp_rank, linear.tp_size)
        # An empty placeholder: what it becomes (int4 buffers or a dense weight) is known only once every
        # part's block type is; the layer's loader still checks shapes against (rows, cols) and narrows. A
        # row-parallel layer at tp > 1 is handed every input column (no input_dim): it narrows rows or columns
        # itself once it knows which it can pack.
        weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        set_param_layout(weight, ParamLayout(weight_loader=shape.weight_loader, output_dim=0,
                                             input_dim=1 if split is None else None,
                                             logical_shape=(rows, cols if split is None else shape.input_size),
                                             load_part=functools.partial(self._record, linear)))
        layer.register_parameter("weight", weight)
        self.set_layer_state(layer, GGUFLayerState(
            prefix=linear.display_name, rows=rows, cols=cols, params_dtype=shape.params_dtype, split=split))

    def _record(self, layer: LinearBase, param: torch.Tensor, part: NarrowedPart) -> None:
        """Remember this rank's narrowed part (nothing is read until every part is in)."""
        tensor = part.narrowed
        base = tensor.base if isinstance(tensor, RowPermutedTensor) else tensor
        if not isinstance(base, GGUFTensor):
            raise UnsupportedError(
                f"{tensor.describe()}: quantization={METHOD_NAME!r} keeps GGUF blocks packed, but this tensor "
                "does not come from a GGUF file; load it without that option"
            )
        self.layer_state(layer, GGUFLayerState).parts.append(part)

    def _kernel_dtype(self, state: GGUFLayerState) -> torch.dtype:
        return self.config.kernel_dtype or kernel_dtype_for(state.params_dtype)

    def _decide(self, state: GGUFLayerState, device: torch.device) -> Decision:
        """What the layer keeps (:func:`~.decide.decide`): the load and :meth:`layer_plan` both ask here."""
        return decide(state, device, self._kernel_dtype(state))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Pack the layer's parts into torch's int4 layout, or dequantize them (reason recorded)."""
        state = self.layer_state(layer, GGUFLayerState)
        if state.choice is not None:
            return
        device = cast(torch.Tensor, layer.weight).device
        # every reason is known before a block is read, so a layer that falls back reads its parts once
        decision = self._decide(state, device)
        delattr(layer, "weight")
        if decision.segments:
            state.choice = keep_segments(layer, state, decision, self.config, self._kernel_dtype(state))
        elif decision.reason is None:
            tensors = [tensor for _, tensor in decision.tensors]
            packed = linear_packing.packed_weight(self.config, decision.kernel, tensors, self._kernel_dtype(state))
            size = linear_packing.keep_packed(layer, "", packed)
            state.plans = self._plans(state, decision.kernel, packed)
            state.choice = KernelChoice(decision.kernel, None, decision.types, size, paths=state.plans)
        else:
            dtype = dense_dtype(state, decision.types, self.config.dense_dtype)
            dense = linear_packing.dense_weight([tensor for _, tensor in decision.tensors], decision.shape, dtype,
                                                device)
            layer.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
            state.choice = KernelChoice(FALLBACK, decision.reason, decision.types, 0, dtype_name(dtype))
        state.row_window = decision.row_window
        state.parts.clear()
        self.config.layer_log[state.prefix] = state.choice

    def _plans(self, state: GGUFLayerState, kernel: str, packed: Int4CpuWeight) -> tuple[TokenPlan, ...]:
        """The path per token count for the load's activations (timed once per layer kind on this machine):
        the packed kernel (on bfloat16-cast activations for a float32 load) or the weight dequantized per call;
        ``kernel_dtype="float32"`` keeps only float32 arithmetic."""
        weight = linear_packing.kernel_weight(kernel, packed)
        return (linear_packing.plan_paths(weight, kernel, self._kernel_dtype(state), state.params_dtype),)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """What :meth:`process_weights_after_loading` will record for this layer, from the GGUF header alone.

        The layer's own loader is handed the checkpoint tensors a load hands it
        (:func:`~.plan.fill_from_header`: narrowed to this rank, nothing read),
        and :meth:`_decide` answers as at load; ``None`` when the header has no
        tensor for one of the layer's parts (the load then says which is missing).
        """
        state = self.layer_state(layer, GGUFLayerState)
        if state.choice is not None:
            return state.choice
        try:
            if not fill_from_header(self.config, layer):
                return None
            decision = self._decide(state, current_session().device)
        finally:
            state.parts.clear()
        kernel_dtype = self._kernel_dtype(state)
        if decision.segments:
            size = sum(linear_packing.packed_bytes(s.kernel, s.rows, state.cols, kernel_dtype)
                       for s in decision.segments if s.kernel != FALLBACK)
            dense = [s for s in decision.segments if s.kernel == FALLBACK]
            dtype_of = dtype_name(dense_dtype(state, dense[0].types, self.config.dense_dtype)) if dense else None
            packed_plans = [paths_from_shapes(state.params_dtype, kernel_dtype, exact=kernel_dtype == torch.float32)
                            for s in decision.segments if s.kernel != FALLBACK]
            return KernelChoice(decision.kernel, decision.reason, decision.types, size, dtype_of,
                                paths=merged_plans([plans for plans in packed_plans if plans]))
        if decision.reason is None:
            size = linear_packing.packed_bytes(decision.kernel, *decision.shape, kernel_dtype)
            paths = paths_from_shapes(state.params_dtype, kernel_dtype, exact=kernel_dtype == torch.float32)
            return KernelChoice(decision.kernel, None, decision.types, size, paths=paths)
        dtype = dtype_name(dense_dtype(state, decision.types, self.config.dense_dtype))
        return KernelChoice(FALLBACK, decision.reason, decision.types, 0, dtype)

    def segments(self, layer: nn.Module) -> list[LayerSegment]:
        """A fused layer's segments (each run of parts on its own kernel), in row order; empty for a layer on one
        kernel (:meth:`int4_weight`) or one dense weight."""
        return current_segments(layer, self.layer_state(layer, GGUFLayerState))

    def int4_weight(self, layer: nn.Module) -> Int4CpuWeight | Int8GroupedWeight | None:
        """The layer's packed weight (built on its current buffers), ``None`` when it was dequantized or is
        split into segments (:meth:`segments`).

        An :class:`~loader.kernels.Int4CpuWeight` for Q4 blocks (``int4``), an
        :class:`~loader.kernels.Int8GroupedWeight` for Q8_0 (``int4x2``, float32 results).
        """
        return self._int4_weight(layer, self.layer_state(layer, GGUFLayerState))

    @staticmethod
    def _int4_weight(layer: nn.Module, state: GGUFLayerState) -> Int4CpuWeight | Int8GroupedWeight | None:
        if state.choice is None:
            raise RuntimeError(f"{state.prefix}: weights are not processed yet")
        if state.choice.kernel not in ("int4", "int4x2"):
            return None
        # read from the buffer dict, not Module.__getattr__, and wrapped once: a decode call reads it every time
        state.int4 = linear_packing.current_packed(layer, "", state.int4)
        return linear_packing.kernel_weight(state.choice.kernel, state.int4)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x W^T + b``; a layer keeping its rows over every input column gathers ``x`` and pads with zeros.

        The padded output (this rank's rows, zeros elsewhere) makes the
        row-parallel layer's all-reduce an exact gather: each output is one
        rank's value plus zeros, as tp=1 computes it. A dequantized weight
        narrower than the activations (:attr:`~.config.GGUFQuantConfig.dense_dtype`)
        computes in its own dtype, as the packed kernel does.
        """
        state = self.layer_state(layer, GGUFLayerState)
        if state.segments:
            out = apply_segments(current_segments(layer, state), x)
            return out if bias is None else out + bias.to(out.dtype)
        packed = self._int4_weight(layer, state)
        weight = cast(torch.Tensor, layer.weight) if packed is None else None
        if weight is not None and state.row_window is None and weight.dtype == x.dtype:
            return torch.nn.functional.linear(x, weight, bias)
        whole = x if state.row_window is None else all_gather(x, dim=-1)
        if weight is not None:
            mine = torch.nn.functional.linear(whole.to(weight.dtype), weight)
        else:
            assert packed is not None
            mine = run_planned(packed, state.plans, whole)
        if state.row_window is None:
            out = mine.to(x.dtype)
        else:
            start, rows = state.row_window
            out = x.new_zeros(*x.shape[:-1], state.rows)
            out[..., start:start + rows] = mine
        return out if bias is None else out + bias.to(out.dtype)
