"""The GGUF token embedding keeps its blocks; a tied output head multiplies with the same bytes.

Dequantized, SmolLM2's Q8_0 embedding (49152 x 576, 30 MB of blocks) becomes
113 MB of float32, more than every packed linear together. Kept, a lookup
dequantizes only the rows asked for, with the plugin's own kernels
(:mod:`loader_plugin_gguf.format.dequantize`), so a row is bit-equal to gguf-py dequantizing the whole
tensor and indexing it. Stored per type:

- Q8_0: int8 codes ``[cols / 32, rows, 32]`` and the blocks' ``d`` as float32
  ``[cols / 32, rows]`` (a code times a widened float16 is exact in float32, so
  a row is ``codes * d``, bit-equal). Q6_K likewise, per 16-value group: codes
  ``q - 32`` ``[cols / 16, rows, 16]``, scales ``d*sc`` — 1.4 bytes a value
  instead of float32's 4, for the Q6_K embeddings and heads of llama.cpp's
  ``_M`` files. A Q8_0 table with a head (``int4x2``) keeps its codes as the
  head's two int4 planes instead (:func:`loader.kernels.pack_int8_grouped`: one call of
  torch's int4 kernel over the high and low nibbles, instead of the per-block
  int8 calls below) and reads
  looked-up rows back from them, so rows stay bit-equal. Otherwise the layout
  serves the head: each 32-column (Q6_K: 16-column) slice of codes is one contiguous int8 matrix for torch's
  ``_weight_int8pack_mm`` with that block's ``d`` as its per-row scale, and the
  head sums the 18 (for 576 columns) partial products (its scales a copy in the
  kernel dtype made at load, ``q8_head_scales``) — exact math on the
  stored codes, rounded only as the kernel dtype rounds. The kernel's dtype is
  the linears' (bfloat16; ``kernel_dtype=float32`` for float32): in float32
  torch's int8 kernel is far slower than in bfloat16 (benchmarks/RESULTS.md),
  and bfloat16 logits flip near-ties, so the head returns float32
  logits with each position's top 64 recomputed exactly from their looked-up
  rows (:meth:`GGUFEmbeddingMethod._refine_top`), for bfloat16 activations too.
- every other type: the raw blocks ``uint8 [rows, row_bytes]``. A tied head of
  Q4_0/Q4_1/Q4_K adds torch's packed int4 weight built from the same blocks
  (:mod:`.q4_blocks`; lookups stay exact from the blocks).

A tied head of a type with neither kernel (Q5_x, Q2_K/Q3_K/Q5_K, F16, ...)
would dequantize the whole table for every token, so that embedding is
dequantized at load as before, with the reason in the load report; so is
one loaded to a device other than the CPU.
"""


from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    KernelChoice,
    KernelOption,
    TokenPlan,
    choose_kernel,
    int4_unsupported_reason,
    int8_grouped_unsupported_reason,
    paths_from_shapes,
    run_planned,
)
from loader.layers import (
    EmbeddingMethodBase,
    EmbeddingShape,
    LinearMethodBase,
    LinearShape,
    ParamLayout,
    VocabParallelEmbedding,
    set_param_layout,
)
from loader.models import all_gather, current_session

from ..format.tensors import GGUFTensor
from .bundle_keys import unit_key
from .embedding_store import (
    BUILDERS,
    HEAD_KERNEL_TYPES,
    INT8_BLOCKS,
    GGUFEmbeddingState,
    Q,
    buffer,
    exact_rows,
    expected_buffers,
    int8_head,
    int8_planes,
    kept_bytes,
)
from .int8_head import Int8HeadWeight
from .linear_packing import plan_paths
from .options import FALLBACK, METHOD_NAME, dtype_name, kernel_dtype_for
from .plan import fill_from_header
from .q4_blocks import GROUP_SIZE, PACKED_TYPES

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import NarrowedPart

    from .config import GGUFQuantConfig

__all__ = ["REFINED_LOGITS", "GGUFEmbeddingMethod", "GGUFHeadMethod"]

REFINED_LOGITS = 64
"""Top logits per position a Q8_0 head recomputes exactly when its kernel is narrower than the activations."""
HEAD_KERNELS = ("int8", "int4x2", "blocks+int4")
"""The head's kernels; each is planned like a linear layer (the kernel, or the head dequantized per call, by
token count) where :func:`planned_head` says."""


def planned_head(kernel: str, kernel_dtype: torch.dtype) -> bool:
    """Whether a head on ``kernel`` is planned: over a bfloat16 kernel its paths take float32 activations
    (``packed-bf16`` is then the kernel on bfloat16-cast activations with float32 results: what the head always
    computed); an int4 head over a float32 kernel gets the exact paths, as the linears do (torch's float32 int4
    kernel is the slow one). The ``int8`` head's float32 kernel is exact arithmetic already and keeps its call
    (the paths offer no float32 kernel), as does any float16 kernel (a ``packed`` path would round its float32
    results to float16)."""
    return kernel in HEAD_KERNELS and (kernel_dtype == torch.bfloat16
                                       or (kernel_dtype == torch.float32 and kernel != "int8"))


class GGUFEmbeddingMethod(EmbeddingMethodBase):
    """One vocabulary embedding of a GGUF file: rows kept as blocks, dequantized when looked up."""

    layer_state_attr = "gguf_state"
    process_weights_concurrently = True  # its own rows in, its own buffers out (a tied head has no step)

    def __init__(self, config: GGUFQuantConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: EmbeddingShape) -> None:
        # a placeholder until the block type is known; the layer's loader checks the shape and narrows the rows
        weight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        set_param_layout(weight, ParamLayout(weight_loader=shape.weight_loader, output_dim=0,
                                             logical_shape=(shape.rows_per_partition, shape.embedding_dim),
                                             load_part=functools.partial(self._record, layer)))
        layer.register_parameter("weight", weight)
        prefix = str(getattr(layer, "display_name", type(layer).__name__))
        self.set_layer_state(layer, GGUFEmbeddingState(prefix, shape.rows_per_partition, shape.embedding_dim,
                                                       shape.params_dtype))

    def _record(self, layer: nn.Module, param: torch.Tensor, part: NarrowedPart) -> None:
        """Remember this rank's rows (nothing is read until the type and the head are known)."""
        if not isinstance(part.narrowed, GGUFTensor):
            raise UnsupportedError(
                f"{part.narrowed.describe()}: quantization={METHOD_NAME!r} keeps GGUF blocks, but this tensor "
                "does not come from a GGUF file; load it without that option"
            )
        self.layer_state(layer, GGUFEmbeddingState).part = part

    def tie_head(self, layer: nn.Module) -> None:
        self.layer_state(layer, GGUFEmbeddingState).tied = True

    def _fallback_reason(self, state: GGUFEmbeddingState, window: GGUFTensor, device: torch.device) -> str | None:
        if device.type != "cpu":
            return f"GGUF blocks are looked up on the CPU, not {device}"
        if state.tied and window.info.ggml_type not in HEAD_KERNEL_TYPES:
            head = "tied output head" if state.lookups else "output head"
            return (f"ggml type {window.stored_type} has no kernel for the {head} "
                    f"({', '.join(Q(t).name for t in HEAD_KERNEL_TYPES)} have)")
        if state.tied and window.info.ggml_type in PACKED_TYPES:
            return int4_unsupported_reason(state.rows, state.cols, GROUP_SIZE)
        return None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Keep the rows' blocks (Q8_0: codes and scales), or dequantize the table when no kernel fits."""
        state = self.layer_state(layer, GGUFEmbeddingState)
        if state.choice is not None:
            return
        if state.part is None:
            raise CheckpointFormatError(f"{state.prefix}: no embedding tensor was loaded")
        window = state.part.narrowed
        assert isinstance(window, GGUFTensor)
        device = buffer(layer, "weight").device
        choice = self._decide(state, window, device)
        real = window.shape[0]
        delattr(layer, "weight")
        if choice.kernel == FALLBACK:
            dense = torch.zeros(state.rows, state.cols, dtype=state.params_dtype, device=device)
            dense[:real].copy_(window.read(state.params_dtype))
            layer.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
            state.choice = choice
        else:
            size = self._keep(layer, state, window, choice.kernel)
            if state.tied and planned_head(choice.kernel, state.kernel_dtype):
                head = self._head_weight(layer, state, choice.kernel)
                state.plans = (plan_paths(head, f"head:{choice.kernel}", state.kernel_dtype, torch.float32),)
            state.choice = attrs.evolve(choice, packed_bytes=size, paths=state.plans)
        state.part = None
        self.config.layer_log[state.prefix] = state.choice

    def _decide(self, state: GGUFEmbeddingState, window: GGUFTensor, device: torch.device) -> KernelChoice:
        """The kernel (``int8``, ``int4x2``, ``blocks`` or ``blocks+int4``, else ``dequantized`` with the reason).

        From the block type, the tied head and the device alone: the load and
        :meth:`layer_plan` both decide here (the bytes kept are filled in
        after). Sets the state's type and kernel dtype.
        """
        state.ggml_type = window.info.ggml_type
        state.kernel_dtype = self.config.kernel_dtype or kernel_dtype_for(state.params_dtype)
        if state.ggml_type in INT8_BLOCKS:
            preferred = "int4x2" if self._int4x2_head(state) else "int8"
        else:
            preferred = "blocks+int4" if state.tied else "blocks"
        return choose_kernel([KernelOption(preferred, self._fallback_reason(state, window, device))], FALLBACK,
                             types=(window.stored_type,), dtype=dtype_name(state.params_dtype))

    @staticmethod
    def _int4x2_head(state: GGUFEmbeddingState) -> bool:
        """Whether a Q8_0 head runs as two int4 planes (:class:`loader.kernels.Int8GroupedWeight`): one int4
        call instead of the int8 kernel's one call per 32-column block. Not for lookups alone (the int8 codes are copied
        faster), nor with the float32 kernel (torch's int4 kernel is slow there; the int8 one is exact)."""
        return (state.tied and state.ggml_type == Q.Q8_0 and state.kernel_dtype != torch.float32
                and int8_grouped_unsupported_reason(state.rows, state.cols) is None)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """What :meth:`process_weights_after_loading` will record, from the GGUF header alone (nothing read)."""
        state = self.layer_state(layer, GGUFEmbeddingState)
        if state.choice is not None:
            return state.choice
        try:
            if not fill_from_header(self.config, layer) or state.part is None:
                return None
            window = state.part.narrowed
            assert isinstance(window, GGUFTensor)
            choice = self._decide(state, window, current_session().device)
            paths: tuple[TokenPlan, ...] = ()
            if state.tied and planned_head(choice.kernel, state.kernel_dtype):
                paths = paths_from_shapes(torch.float32, state.kernel_dtype, exact=state.kernel_dtype == torch.float32)
            return attrs.evolve(choice, packed_bytes=kept_bytes(state, choice.kernel, window), paths=paths)
        finally:
            state.part = None

    def _keep(self, layer: nn.Module, state: GGUFEmbeddingState, window: GGUFTensor, kernel: str) -> int:
        """Register what ``kernel`` keeps (from the packed-weights bundle when an earlier load wrote it); its bytes."""
        key = unit_key(f"embedding:{kernel}", state.kernel_dtype, [window], self.config.files, rows=state.rows,
                       tied=state.tied)
        buffers = self.config.cached_unit(key, functools.partial(BUILDERS[kernel], state, window),
                                          expected_buffers(state, window, kernel))
        assert buffers is not None
        for name, tensor in buffers.items():
            layer.register_buffer(name, tensor)
        return sum(tensor.numel() * tensor.element_size() for tensor in buffers.values())

    def _state(self, layer: nn.Module) -> GGUFEmbeddingState:
        state = self.layer_state(layer, GGUFEmbeddingState)
        if state.choice is None:
            raise RuntimeError(f"{state.prefix}: weights are not processed yet")
        return state

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        state = self._state(layer)
        kernel = cast(KernelChoice, state.choice).kernel
        if kernel == FALLBACK:
            return torch.nn.functional.embedding(ids, buffer(layer, "weight"))
        return exact_rows(layer, state, ids).to(state.params_dtype)


    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The head's logits ``x @ W.T`` over this rank's rows, from the embedding's storage (float32).

        Every model's logits are widened to float32 after the head, so a
        kernel narrower than float32 has its top logits refined exactly
        (:meth:`_refine_top`), for bfloat16 activations too.
        """
        state = self._state(layer)
        kernel = cast(KernelChoice, state.choice).kernel
        if kernel == FALLBACK:
            return torch.nn.functional.linear(x, buffer(layer, "weight"), bias)
        if kernel not in HEAD_KERNELS:
            raise RuntimeError(f"{state.prefix}: no output head is tied to this embedding")
        dtype = state.kernel_dtype
        flat = x.reshape(-1, state.cols)
        weight = self._head_weight(layer, state, kernel)
        if state.plans:
            out = run_planned(weight, state.plans, flat.to(torch.float32)).to(torch.float32)
        else:  # the kernel's own call (float32 results for int8 and int4x2, as always)
            out = weight.matmul(flat.to(dtype)).to(torch.float32)
        if dtype != torch.float32:
            self._refine_top(layer, flat.to(torch.float32), out)
        out = out.view(*x.shape[:-1], state.rows)
        return out if bias is None else out + bias.to(out.dtype)

    @staticmethod
    def _head_weight(layer: nn.Module, state: GGUFEmbeddingState,
                     kernel: str) -> Int4CpuWeight | Int8GroupedWeight | Int8HeadWeight:
        """The head's weight (``kernel`` one of :data:`HEAD_KERNELS`) over the layer's current buffers."""
        if kernel == "int8":
            return int8_head(layer, state)
        if kernel == "int4x2":
            return int8_planes(layer, state)
        return Int4CpuWeight(buffer(layer, "packed_weight"), buffer(layer, "packed_scales_and_zeros"), GROUP_SIZE,
                             state.cols)

    def _refine_top(self, layer: nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
        """Recompute each position's :data:`REFINED_LOGITS` largest logits exactly, in float32, in place.

        The kernel rounds every block's partial product (the int4 kernel its
        output) to bfloat16, enough to swap near-tied top tokens
        (benchmarks/RESULTS.md); the true top token is
        among the kernel's top 64 unless the rounding moves a logit by more
        than the gap to the 64th, so greedy decoding sees float32 logits
        where it looks. The rows come from the exact lookup
        (:func:`~.embedding_store.exact_rows`): ~64 rows per position, not the table.

        Every logit at or above the 64th largest is refined — ties at the
        64th included, so the set does not hang on how ``topk`` breaks them.
        Under tensor parallelism the 64th largest is the whole vocabulary's
        (the ranks' top values gathered) and each rank refines its rows above
        it: the logits are tp=1's. Padding rows are never picked.
        """
        state = self._state(layer)
        k = min(REFINED_LOGITS, out.shape[1])
        real_rows = cast(VocabParallelEmbedding, layer).real_rows  # the rest pad the table to the TP split
        scores = out
        if real_rows < out.shape[1]:
            scores = out.clone()
            scores[:, real_rows:] = float("-inf")
        values = scores.topk(k, dim=1).values  # [m, k]
        if int(getattr(layer, "tp_size", 1)) > 1:
            values = all_gather(values, dim=1).topk(k, dim=1).values
        positions, rows = (scores >= values[:, -1:]).nonzero(as_tuple=True)
        exact = (exact_rows(layer, state, rows) * x[positions]).sum(-1)
        out[positions, rows] = exact.to(out.dtype)



class GGUFHeadMethod(LinearMethodBase):
    """An untied output head (``output.weight``) kept as the embedding would keep it for a tied head.

    The head is a linear layer to the core (``ParallelLMHead`` asks for a
    linear method), so this adapter hands its steps to a
    :class:`GGUFEmbeddingMethod` keeping what a tied head keeps: int8 codes
    and scales for Q8_0/Q6_K, the blocks and a packed int4 copy for
    Q4_0/Q4_1/Q4_K (the rows the top logits are refined from come from the
    codes or the blocks), the load dtype's table for any other type. llama.cpp stores the head of
    its ``_M`` / ``Q4_0`` files as Q6_K: an 8B Llama's is 525M values, 2.1 GB
    as float32 and 0.7 GB as int8 codes and scales.
    """

    layer_state_attr = GGUFEmbeddingMethod.layer_state_attr
    process_weights_concurrently = GGUFEmbeddingMethod.process_weights_concurrently

    def __init__(self, config: GGUFQuantConfig) -> None:
        self.config = config
        self._embedding = GGUFEmbeddingMethod(config)

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        self._embedding.create_weights(layer, EmbeddingShape(
            rows_per_partition=shape.output_size_per_partition, embedding_dim=shape.input_size_per_partition,
            params_dtype=shape.params_dtype, weight_loader=shape.weight_loader,
        ))
        state = self.layer_state(layer, GGUFEmbeddingState)
        state.tied, state.lookups = True, False

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self._embedding.process_weights_after_loading(layer)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        return self._embedding.layer_plan(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._embedding.apply(layer, x, bias)
