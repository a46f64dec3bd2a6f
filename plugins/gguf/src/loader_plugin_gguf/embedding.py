"""The GGUF token embedding keeps its blocks; a tied output head multiplies with the same bytes.

Dequantized, SmolLM2's Q8_0 embedding (49152 x 576, 30 MB of blocks) becomes
113 MB of float32, more than every packed linear together. Kept, a lookup
dequantizes only the rows asked for, with the plugin's own kernels
(:mod:`.dequantize`), so a row is bit-equal to gguf-py dequantizing the whole
tensor and indexing it. Stored per type:

- Q8_0: int8 codes ``[cols / 32, rows, 32]`` and the blocks' ``d`` as float32
  ``[cols / 32, rows]`` (a code times a widened float16 is exact in float32, so
  a row is ``codes * d``, bit-equal). Q6_K likewise, per 16-value group: codes
  ``q - 32`` ``[cols / 16, rows, 16]``, scales ``d*sc`` — 1.4 bytes a value
  instead of float32's 4, for the Q6_K embeddings and heads of llama.cpp's
  ``_M`` files. A Q8_0 table with a head (``int4x2``) keeps its codes as the
  head's two int4 planes instead (:func:`loader.kernels.pack_int8_grouped`: one call of
  torch's int4 kernel over the high and low nibbles, ~3 ms a token for
  SmolLM2's head against ~7 ms for the per-block int8 calls below) and reads
  looked-up rows back from them, so rows stay bit-equal. Otherwise the layout
  serves the head: each 32-column (Q6_K: 16-column) slice of codes is one contiguous int8 matrix for torch's
  ``_weight_int8pack_mm`` with that block's ``d`` as its per-row scale, and the
  head sums the 18 (for 576 columns) partial products (its scales a copy in the
  kernel dtype made at load, ``q8_head_scales``) — exact math on the
  stored codes, rounded only as the kernel dtype rounds. The kernel's dtype is
  the linears' (bfloat16; ``kernel_dtype=float32`` for float32): in float32
  torch's int8 kernel is slow (SmolLM2 decode 12 tok/s against 45 in
  bfloat16), and bfloat16 logits flip near-ties, so the head returns float32
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
from gguf.constants import GGMLQuantizationType

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    KernelChoice,
    KernelOption,
    choose_kernel,
    int4_unsupported_reason,
    int8_grouped_unsupported_reason,
    pack_int4,
    pack_int8_grouped,
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
from loader.models import all_gather

from .dequantize import block_shape, dequantize_into
from .kernels_kquants import q6_k_codes
from .kernels_legacy import half_at
from .packed_linear import FALLBACK, METHOD_NAME, dtype_name, kernel_dtype_for
from .q4_blocks import GROUP_SIZE, PACKED_TYPES, affine_rows, int8_rows
from .tensors import GGUFTensor

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import NarrowedPart

    from .packed_linear import GGUFQuantConfig

__all__ = ["HEAD_KERNEL_TYPES", "INT8_BLOCKS", "GGUFEmbeddingMethod", "GGUFEmbeddingState", "GGUFHeadMethod"]

Q = GGMLQuantizationType
INT8_BLOCKS = {Q.Q8_0: 32, Q.Q6_K: 16}
"""Symmetric block types kept as int8 codes and one float32 scale per block of this many columns (Q8_0: ``d``;
Q6_K: ``d*sc`` of each 16-value group, codes ``q - 32``): ``codes * scale`` is gguf-py's value exactly."""
HEAD_KERNEL_TYPES = (*INT8_BLOCKS, *PACKED_TYPES)
"""Block types a tied head multiplies with directly (int8 codes per block, or packed int4)."""


@attrs.define
class GGUFEmbeddingState:
    """This rank's table size, the narrowed rows handed in, whether a head is tied, and what was kept."""

    prefix: str
    rows: int
    cols: int
    params_dtype: torch.dtype
    part: NarrowedPart | None = None
    tied: bool = False
    lookups: bool = True
    """False for an untied output head (:class:`GGUFHeadMethod`): nothing is looked up, rows only refine logits."""
    ggml_type: int | None = None
    kernel_dtype: torch.dtype = torch.bfloat16
    choice: KernelChoice | None = None


def _kept_bytes(state: GGUFEmbeddingState, kernel: str, window: GGUFTensor) -> int:
    """The bytes ``kernel`` keeps for this rank's padded table: what the load's buffers will hold."""
    from .layer_plan import int4_packed_bytes

    if kernel == "int4x2":
        # the planes (an int4 weight of twice the rows, as a Q8_0 linear keeps) and float32 block scales
        groups = state.cols // INT8_BLOCKS[Q.Q8_0]
        return int4_packed_bytes(2 * state.rows, state.cols, state.kernel_dtype) + groups * state.rows * 4
    if kernel == "int8":
        # int8 codes, float32 block scales, and the tied head's copy in the kernel dtype
        groups = state.cols // INT8_BLOCKS[Q(window.info.ggml_type)]
        copied = state.tied and state.kernel_dtype != torch.float32
        head = groups * state.rows * state.kernel_dtype.itemsize if copied else 0
        return state.rows * state.cols + groups * state.rows * 4 + head
    if kernel.startswith("blocks"):
        block, size = block_shape(window.info.ggml_type)
        head = int4_packed_bytes(state.rows, state.cols, state.kernel_dtype) if kernel == "blocks+int4" else 0
        return state.rows * (state.cols // block * size) + head
    return 0


REFINED_LOGITS = 64
"""Top logits per position a Q8_0 head recomputes exactly when its kernel is narrower than the activations."""


def _buffer(layer: nn.Module, name: str) -> torch.Tensor:
    return cast(torch.Tensor, getattr(layer, name))


def _int8_planes(layer: nn.Module, state: GGUFEmbeddingState) -> Int8GroupedWeight:
    """The ``int4x2`` kernel's weight over this layer's buffers."""
    planes = Int4CpuWeight(_buffer(layer, "q8_planes"), _buffer(layer, "q8_planes_scales_and_zeros"),
                           INT8_BLOCKS[Q.Q8_0], state.cols)
    return Int8GroupedWeight(planes, state.rows)


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
        device = _buffer(layer, "weight").device
        choice = self._decide(state, window, device)
        real = window.shape[0]
        delattr(layer, "weight")
        if choice.kernel == FALLBACK:
            dense = torch.zeros(state.rows, state.cols, dtype=state.params_dtype, device=device)
            dense[:real].copy_(window.read(state.params_dtype))
            layer.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
            state.choice = choice
        else:
            state.choice = attrs.evolve(choice, packed_bytes=self._keep(layer, state, window, choice.kernel))
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
        from loader.models import current_session

        from .layer_plan import fill_from_header

        state = self.layer_state(layer, GGUFEmbeddingState)
        if state.choice is not None:
            return state.choice
        try:
            if not fill_from_header(self.config, layer) or state.part is None:
                return None
            window = state.part.narrowed
            assert isinstance(window, GGUFTensor)
            choice = self._decide(state, window, current_session().device)
            return attrs.evolve(choice, packed_bytes=_kept_bytes(state, choice.kernel, window))
        finally:
            state.part = None

    def _keep(self, layer: nn.Module, state: GGUFEmbeddingState, window: GGUFTensor, kernel: str) -> int:
        """Register what ``kernel`` keeps (from the packed-weights bundle when an earlier load wrote it); its bytes."""
        from .packed_cache import unit_key

        key = unit_key(f"embedding:{kernel}", state.kernel_dtype, [window], self.config.files, rows=state.rows,
                       tied=state.tied)
        buffers = self.config.cached_unit(key, functools.partial(_BUILDERS[kernel], state, window),
                                          _expected_buffers(state, window, kernel))
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
        if kernel == "dequantized":
            return torch.nn.functional.embedding(ids, _buffer(layer, "weight"))
        return self._exact_rows(layer, state, ids).to(state.params_dtype)

    @staticmethod
    def _exact_rows(layer: nn.Module, state: GGUFEmbeddingState, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` of the kept blocks, float32 ``[*ids.shape, cols]``: exact, whatever the load's dtype."""
        flat = ids.reshape(-1)
        if cast(KernelChoice, state.choice).kernel == "int4x2":
            groups = state.cols // INT8_BLOCKS[Q.Q8_0]
            codes = _int8_planes(layer, state).codes(flat).view(-1, groups, INT8_BLOCKS[Q.Q8_0])
            scales = _buffer(layer, "q8_scales")[:, flat].t()  # [n, groups]
            rows = (codes.to(torch.float32) * scales.unsqueeze(-1)).reshape(-1, state.cols)
        elif state.ggml_type in INT8_BLOCKS:
            codes = _buffer(layer, "q8_codes")[:, flat]  # [groups, n, block]
            scales = _buffer(layer, "q8_scales")[:, flat]
            rows = (codes.to(torch.float32) * scales.unsqueeze(-1)).transpose(0, 1).reshape(-1, state.cols)
        else:
            rows = torch.empty(flat.numel(), state.cols, dtype=torch.float32, device=flat.device)
            dequantize_into(_buffer(layer, "blocks").index_select(0, flat), cast(int, state.ggml_type), rows)
        return rows.view(*ids.shape, state.cols)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The head's logits ``x @ W.T`` over this rank's rows, from the embedding's storage (float32).

        Every model's logits are widened to float32 after the head, so a
        kernel narrower than float32 has its top logits refined exactly
        (:meth:`_refine_top`), for bfloat16 activations too.
        """
        state = self._state(layer)
        kernel = cast(KernelChoice, state.choice).kernel
        if kernel == "dequantized":
            return torch.nn.functional.linear(x, _buffer(layer, "weight"), bias)
        if kernel not in ("int8", "int4x2", "blocks+int4"):
            raise RuntimeError(f"{state.prefix}: no output head is tied to this embedding")
        dtype = state.kernel_dtype
        flat = x.reshape(-1, state.cols)
        if kernel == "int4x2":
            out = _int8_planes(layer, state).matmul(flat.to(dtype))
        elif kernel == "int8":
            out = self._int8_head(layer, flat.to(dtype), dtype)
        else:
            packed = Int4CpuWeight(_buffer(layer, "packed_weight"), _buffer(layer, "packed_scales_and_zeros"),
                                   GROUP_SIZE, state.cols)
            out = packed.matmul(flat.to(dtype)).to(torch.float32)
        if dtype != torch.float32:
            self._refine_top(layer, flat.to(torch.float32), out)
        out = out.view(*x.shape[:-1], state.rows)
        return out if bias is None else out + bias.to(out.dtype)

    def _refine_top(self, layer: nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
        """Recompute each position's :data:`REFINED_LOGITS` largest logits exactly, in float32, in place.

        The kernel rounds every block's partial product (the int4 kernel its
        output) to bfloat16, enough to swap near-tied top tokens (SmolLM2:
        top-1 agreement with the float32 model 0.973); the true top token is
        among the kernel's top 64 unless the rounding moves a logit by more
        than the gap to the 64th, so greedy decoding sees float32 logits
        where it looks. The rows come from the exact lookup
        (:meth:`_exact_rows`): ~64 rows per position, not the table.

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
        exact = (self._exact_rows(layer, state, rows) * x[positions]).sum(-1)
        out[positions, rows] = exact.to(out.dtype)

    @staticmethod
    def _int8_head(layer: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``sum_g (x_g @ codes_g.T) * d_g``: one int8 matmul per 32-column block, its ``d`` as the row scale."""
        codes = _buffer(layer, "q8_codes")
        # the head's scales in the kernel's dtype, cast once at load (casting 49152 x 18 per token cost ~0.4 ms)
        head_scales = getattr(layer, "q8_head_scales", None)
        scales = head_scales if isinstance(head_scales, torch.Tensor) else _buffer(layer, "q8_scales")
        if scales.dtype != dtype:
            scales = scales.to(dtype)
        groups, block = codes.shape[0], codes.shape[2]
        # one copy gives every block's activations as a contiguous [m, 32] matrix (not one copy per block)
        parts = x.reshape(x.shape[0], groups, block).transpose(0, 1).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(parts[0], codes[0], scales[0]).to(torch.float32)
        for g in range(1, groups):
            out += torch.ops.aten._weight_int8pack_mm(parts[g], codes[g], scales[g])
        return out


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


def _int8_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """Int8 codes ``[groups, rows, block]`` and float32 scales ``[groups, rows]`` (:data:`INT8_BLOCKS`), and a
    tied head's scales in the kernel dtype."""
    raw, _ = window.enclosing_blocks()
    window.stats.add(raw.numel(), tensors=1)
    ggml_type = Q(window.info.ggml_type)
    block = INT8_BLOCKS[ggml_type]
    groups, real = state.cols // block, raw.shape[0]
    # written once each: the file's rows copied in, only the padding rows zeroed
    codes = torch.empty(groups, state.rows, block, dtype=torch.int8)
    scales = torch.empty(groups, state.rows, dtype=torch.float32)
    if ggml_type == Q.Q8_0:
        _, size = block_shape(Q.Q8_0)
        blocks = raw.reshape(real, groups, size)
        codes[:, :real].copy_(blocks[:, :, 2:].transpose(0, 1).view(torch.int8))
        scales[:, :real].copy_(half_at(blocks.reshape(-1, size), 0).view(real, groups).t())
    else:
        _, size = block_shape(ggml_type)
        super_codes, super_scales = q6_k_codes(raw.contiguous().view(-1, size))
        codes[:, :real].copy_(super_codes.view(real, groups, block).transpose(0, 1))
        scales[:, :real].copy_(super_scales.view(real, groups).t())
    codes[:, real:].zero_()
    scales[:, real:].zero_()
    buffers = {"q8_codes": codes, "q8_scales": scales}
    if state.tied and state.kernel_dtype != scales.dtype:
        buffers["q8_head_scales"] = scales.to(state.kernel_dtype)
    return buffers


def _int4x2_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """Q8_0 codes as the head's two int4 planes (rows read back from them), float32 scales ``[groups, rows]``."""
    decoded = int8_rows(window)  # codes: a view of the file's blocks, the planes are built straight from it
    codes, scales = decoded.codes, decoded.scales
    real = int(codes.shape[0])
    if real < state.rows:  # this rank's share of the padded vocabulary: zero codes and scales below
        codes = torch.nn.functional.pad(codes, (0, 0, 0, 0, 0, state.rows - real))
        scales = torch.nn.functional.pad(scales, (0, state.rows - real))
    weight = pack_int8_grouped(codes, scales, state.kernel_dtype)
    return {"q8_scales": scales, "q8_planes": weight.planes.data,
            "q8_planes_scales_and_zeros": weight.planes.scales_and_zeros}


def _blocks_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """The rows' raw blocks, the padding rows zero (zero bytes dequantize to 0.0)."""
    raw, _ = window.enclosing_blocks()
    window.stats.add(raw.numel(), tensors=1)
    blocks = torch.zeros(state.rows, raw.shape[1], dtype=torch.uint8)
    blocks[: raw.shape[0]].copy_(raw)
    return {"blocks": blocks}


def _blocks_and_head_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """The raw blocks, and the tied head's packed int4 weight built from the same blocks."""
    decoded = affine_rows(window)
    pad = state.rows - decoded.codes.shape[0]
    codes = torch.nn.functional.pad(decoded.codes, (0, 0, 0, pad))
    scales = torch.nn.functional.pad(decoded.scales, (0, pad))
    biases = torch.nn.functional.pad(decoded.biases, (0, pad))
    packed = pack_int4(codes, scales, biases, GROUP_SIZE, state.kernel_dtype)
    return {**_blocks_buffers(state, window), "packed_weight": packed.data,
            "packed_scales_and_zeros": packed.scales_and_zeros}


_BUILDERS = {"int8": _int8_buffers, "int4x2": _int4x2_buffers, "blocks": _blocks_buffers,
             "blocks+int4": _blocks_and_head_buffers}


def _expected_buffers(state: GGUFEmbeddingState, window: GGUFTensor,
                      kernel: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """What each of ``kernel``'s buffers must be (dtype, shape) for this rank's table: a stored unit is checked
    against it."""
    rows, cols, dtype = state.rows, state.cols, state.kernel_dtype
    if kernel == "int4x2":
        groups = cols // INT8_BLOCKS[Q.Q8_0]
        return {"q8_scales": (torch.float32, (groups, rows)), "q8_planes": (torch.uint8, (2 * rows, cols // 2)),
                "q8_planes_scales_and_zeros": (dtype, (cols // GROUP_SIZE, 2 * rows, 2))}
    if kernel == "int8":
        block = INT8_BLOCKS[Q(window.info.ggml_type)]
        expected = {"q8_codes": (torch.int8, (cols // block, rows, block)),
                    "q8_scales": (torch.float32, (cols // block, rows))}
        if state.tied and dtype != torch.float32:
            expected["q8_head_scales"] = (dtype, (cols // block, rows))
        return expected
    expected = {"blocks": (torch.uint8, (rows, window.nbytes // max(window.shape[0], 1)))}
    if kernel == "blocks+int4":
        expected["packed_weight"] = (torch.uint8, (rows, cols // 2))
        expected["packed_scales_and_zeros"] = (dtype, (cols // GROUP_SIZE, rows, 2))
    return expected
