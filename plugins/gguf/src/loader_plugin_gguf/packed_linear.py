"""GGUF Q4_0 / Q4_1 / Q4_K (and Q8_0) weights stay packed on the CPU (torch's int4 kernel).

Chosen by default for a GGUF load on the CPU (see :func:`packing_requested`),
or always with ``quantization="gguf"``. Dequantized instead, a GGUF file
becomes floats at load time (SmolLM2 Q4_1: 97 MB of blocks become 538 MB of
float32, and writing that fresh memory is most of the load). Packed, each
parallel linear layer keeps its blocks: the layer's own ``weight_loader``
splits fused tensors (``qkv_proj``, ``gate_up_proj``) and narrows to this rank
as for every method, and the part handed to :meth:`GGUFLinearMethod._record`
is only remembered (nothing is read). After loading, every part of the layer
is decoded from its blocks into codes, scales and biases (:mod:`.q4_blocks`;
llama.cpp's q/k rotary interleave is undone on the block rows) and packed by
:func:`loader.kernels.pack_int4` — Q4_0/Q4_1 by :func:`~loader_plugin_gguf.half_split.pack_int4_half_split_parts`
straight from the blocks' nibbles (unpacking every code to a byte first was
half of a SmolLM2 load). A Q8_0 layer keeps its int8 codes as two int4
planes of the same kernel (``int4x2``, :func:`loader.kernels.pack_int8_grouped`:
``c d = (h - 8) 16d + (l - 8) d + 8d`` for the codes' high and low nibbles),
a byte a value where dequantized bfloat16 holds two.

A layer falls back to today's dequantized weight, with the reason recorded in
the load report, when its parts are another block type (Q5_x, Q6_K, F16, ...:
torch's int8 weight-only kernel ``_weight_int8pack_mm`` takes one scale per
output row, which cannot express their per-16/32-value scales exactly, and
the int4 kernel's groups are 32 wide), a TP split cuts a block, the kernel
refuses the shape, or the target device is not the CPU — one layer at a
time, so a Q4_K_M-style file mixing types keeps what it can packed. A fused
layer whose parts need different kernels (a Q6_K ``v`` beside Q4_K ``q`` and
``k``, Q8_0 beside Q4) keeps each run of consecutive parts on its own kernel
(:class:`LayerSegment`, kernel ``int4+dequantized`` / ``int4+int4x2``): one
call per segment, the outputs side by side. With ``dtype="auto"`` a fallback layer of
quantized blocks holds the kernel's dtype (bfloat16) rather than float32
(:attr:`GGUFQuantConfig.dense_dtype`; float tensors keep the layer's dtype).
Every reason is decided from block types and shapes before a block is read,
so ``loader inspect --layers`` plans each layer from the header alone
(:meth:`GGUFLinearMethod.layer_plan`, :mod:`.layer_plan`).

What a packing call makes is kept on disk between loads (:class:`loader.kernels.PackedBundle`, keyed by
:mod:`.packed_cache`; :meth:`GGUFQuantConfig.cached_unit`): a later load of the same file maps the
bytes the first one packed instead of packing them into fresh memory again.

The kernel computes in bfloat16 (float16 when the load dtype is float16): in
float32 it is ten to a hundred times slower (``format_options={"kernel_dtype":
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
products instead was 2.4e-3 off tp=1. Rows the kernel refuses (no multiple of
16 a rank) keep the columns, as other methods do.

Exactness: the packed weight is ``(q - 8) * s + z`` in the kernel dtype, from
the file's own block fields: ``s = d``, ``z = bias + 8 d`` (Q4_K: ``s = d sc``,
``z = -dmin m + 8 d sc``), computed in float32. With float32 scales the
kernel's weight is bit-equal to gguf-py's dequantization wherever ``z`` is
exact in float32 — every Q4_0/Q4_1 group of real files, and Q4_K's unless
``dmin m`` and ``8 d sc`` lie many binades apart — and within that one
rounding elsewhere. With bfloat16 scales (what runs by default) it is ``(q -
8) bf16(s) + bf16(z)``; for Q4_0 (``z = 0``) that is gguf-py's dequantization
with ``d`` rounded to bfloat16 (``tests/plugins/gguf/test_packed.py``).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, cast

import attrs
import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    KernelChoice,
    KernelOption,
    choose_kernel,
    int4_unsupported_reason,
    int8_grouped_unsupported_reason,
    native_repack,
    native_repack_unavailable_reason,
    pack_int4,
    pack_int8_grouped,
)
from loader.layers import (
    LinearBase,
    LinearMethodBase,
    LinearShape,
    ParallelLMHead,
    ParamLayout,
    QuantizationConfig,
    RowParallelLinear,
    VocabParallelEmbedding,
    set_param_layout,
)
from loader.models import all_gather
from loader.weights import CheckpointTensor, RowPermutedTensor

from .half_split import pack_int4_half_split_parts
from .q4_blocks import (
    GROUP_SIZE,
    HALF_SPLIT_TYPES,
    affine_rows,
    half_split_rows,
    int8_rows,
    kernel_for,
    packing_reason,
)
from .tensors import GGUFTensor

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch import nn

    from loader.checkpoint import LoadOptions
    from loader.layers import NarrowedPart, QuantizeMethodBase

    from loader.kernels import PackedBundle

__all__ = ["METHOD_NAME", "GGUFLayerState", "GGUFLinearMethod", "GGUFQuantConfig", "LayerSegment",
           "RankSplit",
           "dtype_name", "kernel_dtype_for", "kernel_dtype_requested", "packing_requested"]

METHOD_NAME = "gguf"
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_HALF_SPLIT_NAMES = tuple(t.name for t in HALF_SPLIT_TYPES)


def _format_option(options: LoadOptions, key: str) -> str | None:
    value = options.extra.get("format_options", {}).get(key)
    return None if value is None else str(value).strip().lower()


def packing_requested(options: LoadOptions) -> bool:
    """Whether a GGUF load that names no quantization keeps its blocks packed.

    Yes on the CPU when the dtype is ``"auto"`` (GGUF's default: float32
    activations, the linears through the bfloat16 kernel) or one the kernel
    computes in (bfloat16, float16). No when float32 is asked for by name, on
    another device, or with ``format_options={"dequantize": True}`` (CLI:
    ``--format-option dequantize=true``): the weights are dequantized as before.
    """
    text = _format_option(options, "dequantize") or "false"
    if text not in _YES + _NO:
        raise UnsupportedError(f"format option dequantize={text!r} is not a yes/no value; use true or false")
    if text in _YES or options.device.type != "cpu":
        return False
    return bool(options.extra.get("dtype_auto")) or options.dtype in _KERNEL_DTYPES


def kernel_dtype_for(load_dtype: torch.dtype) -> torch.dtype:
    """The int4 kernel's default dtype for a load: the load's own when the kernel is fast in it, else bfloat16."""
    return load_dtype if load_dtype in _KERNEL_DTYPES else torch.bfloat16


def kernel_dtype_requested(options: LoadOptions) -> torch.dtype | None:
    """``format_options={"kernel_dtype": "float32"}``: the int4 kernel computes in float32.

    Ten to a hundred times slower than its bfloat16 path, but its weight is
    gguf-py's dequantization (wherever the zero point is exact in float32)
    and its outputs are float32. ``None``: bfloat16 (float16 for a float16 load).
    """
    text = _format_option(options, "kernel_dtype")
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if text is None:
        return None
    if text not in choices:
        raise UnsupportedError(f"format option kernel_dtype={text!r} is not supported; use one of "
                               f"{', '.join(choices)}")
    return choices[text]


_FLOAT_TYPE_NAMES = ("F32", "F16", "BF16", "F64")
_PACKED_CACHE_LOCK = threading.Lock()
"""Guards making a config's :class:`~loader.kernels.PackedBundle` (layers ask from worker threads);
module-wide, so the config itself holds no lock."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as load reports name dtypes."""
    return str(dtype).removeprefix("torch.")


@attrs.define
class GGUFQuantConfig(QuantizationConfig):
    """The user's request to keep GGUF blocks packed; records each layer's choice for the load report."""

    name = METHOD_NAME
    kernel_dtype: torch.dtype | None = None
    """The dtype the int4 kernel computes in; ``None``: :func:`kernel_dtype_for` the layer's dtype."""
    dense_dtype: torch.dtype | None = None
    """The dtype a layer of quantized blocks that cannot stay packed is dequantized to (``None``: the layer's
    own). A ``dtype="auto"`` load sets the kernel's: Q6_K/Q8_0 layers of a Q4_K_M file then take 2 bytes a
    value, not float32's 4 (float tensors keep the layer's dtype)."""
    head_type: int | None = None
    """The ggml type of the file's own ``output.weight`` (``None``: the head is tied to the embedding). A type
    with a head kernel is kept by :class:`~loader_plugin_gguf.embedding.GGUFHeadMethod`."""
    layer_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False)
    files: tuple[str, ...] = attrs.field(default=(), eq=False)
    """The load's GGUF files, whose headers ``layer_plan`` plans from (empty: layers are decided at load)."""
    use_packed_cache: bool = attrs.field(default=False, eq=False)
    """Whether packed layers are looked up in (and written to) the on-disk bundle for :attr:`files`
    (:mod:`~loader_plugin_gguf.packed_cache`)."""
    _header_tensors: dict[str, CheckpointTensor] | None = attrs.field(default=None, init=False, eq=False,
                                                                      repr=False)
    _packed_cache: PackedBundle | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """During the load only: :meth:`finish_packed_cache` keeps its report and lets it go (it holds a lock and the
    bundle's map, and ``torch.save(model)`` pickles this config with every layer's method)."""
    _packed_cache_report: dict[str, Any] | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def packed_cache(self) -> PackedBundle | None:
        """This load's :class:`~loader.kernels.PackedBundle` (made on first use, in the load's
        session: the bundle is per tensor parallel rank and size), ``None`` when it is off or the files unknown."""
        if not self.use_packed_cache or not self.files or self._packed_cache_report is not None:
            return None
        with _PACKED_CACHE_LOCK:
            if self._packed_cache is None:
                from loader.models import current_session

                from .packed_cache import open_bundle

                session = current_session()
                variant = {"tp_rank": session.tp_rank, "tp_size": session.tp_size,
                           "kernel_dtype": None if self.kernel_dtype is None else dtype_name(self.kernel_dtype),
                           "dense_dtype": None if self.dense_dtype is None else dtype_name(self.dense_dtype)}
                self._packed_cache = open_bundle(self.files, variant)
            return self._packed_cache

    def finish_packed_cache(self) -> None:
        """After every layer is processed: write the bundle when this load packed a unit it did not find."""
        cache = self._packed_cache
        if cache is not None:
            cache.finish()
            self._packed_cache_report, self._packed_cache = cache.describe(), None

    def cached_unit(self, key: str | None, build: Callable[[], dict[str, torch.Tensor] | None],
                    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> dict[str, torch.Tensor] | None:
        """The unit ``key`` from the bundle, else ``build()``'s tensors, stored for the bundle (``build`` returns
        ``None`` for a result the bundle cannot hold; ``key`` ``None``: never cached). A stored unit whose
        tensors are not ``expected`` (name -> dtype, shape) is packed again."""
        cache = self.packed_cache() if key is not None else None
        if cache is None or key is None:
            return build()
        return cache.cached(key, build, expected)

    def header_tensors(self) -> dict[str, CheckpointTensor]:
        """Every tensor of :attr:`files` under the name a load gives it, read from the headers only (cached).

        The load's own stream (:func:`~loader_plugin_gguf.weight_stream.iter_gguf_weights`) names them,
        so a plan maps GGUF tensors to layers exactly as a load does, q/k rotary reordering included.
        """
        if self._header_tensors is None:
            from loader.weights import ReadStats

            from .weight_stream import iter_gguf_weights

            self._header_tensors = dict(iter_gguf_weights(self.files, ReadStats())) if self.files else {}
        return self._header_tensors

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for _, choice in sorted(self.layer_log.items()):  # layers finish in any order when processed concurrently
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        return {
            "method": self.name, "kernels": counts,
            "kernel_dtype": None if self.kernel_dtype is None else dtype_name(self.kernel_dtype),
            "dense_dtype": None if self.dense_dtype is None else dtype_name(self.dense_dtype),
            "packed_bytes": sum(choice.packed_bytes for choice in self.layer_log.values()),
            "packing": _packing(counts),
            "layers": {prefix: choice.record() for prefix, choice in sorted(self.layer_log.items())},
            "packed_cache": (self._packed_cache.describe() if self._packed_cache is not None
                             else self._packed_cache_report),
        }

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`GGUFLinearMethod` for every parallel linear layer,
        :class:`~loader_plugin_gguf.embedding.GGUFEmbeddingMethod` for the token embedding and
        :class:`~loader_plugin_gguf.embedding.GGUFHeadMethod` for an untied output head."""
        if isinstance(layer, LinearBase):
            return GGUFLinearMethod(self)
        if isinstance(layer, ParallelLMHead):
            from .embedding import HEAD_KERNEL_TYPES, GGUFHeadMethod  # it imports this module

            # tied (no output.weight): the embedding keeps the table; a float head stays dense (and mapped)
            return GGUFHeadMethod(self) if self.head_type in HEAD_KERNEL_TYPES else None
        if isinstance(layer, VocabParallelEmbedding):
            from .embedding import GGUFEmbeddingMethod

            return GGUFEmbeddingMethod(self)
        return None


def _packing(kernels: dict[str, int]) -> str | None:
    """What packed this load's int4 layers: ``compiled`` (:func:`loader.kernels.native_repack`'s helpers, for
    Q4_0/Q4_1 codes and Q8_0 planes) or ``torch: <why not>``; ``None`` when no layer is on the int4 kernel."""
    if not any("int4" in kernel for kernel in kernels):
        return None
    if native_repack() is not None:
        return "compiled"
    return f"torch: {native_repack_unavailable_reason()}"


@attrs.frozen
class RankSplit:
    """A row-parallel layer at tp > 1: its part arrives with every input column, and this rank's share.

    :ivar rank: this rank.
    :ivar size: the tensor parallel size.
    """

    rank: int
    size: int


@attrs.define
class GGUFLayerState:
    """One layer's size and the narrowed parts handed to it, until they are packed or dequantized.

    ``rows`` x ``cols`` is the layer's own per-rank shape. A row-parallel layer at tp > 1 (``split``) is handed
    its whole weight and keeps either this rank's output rows over every input column (``row_window``, packed
    or dequantized; the input gathered in :meth:`GGUFLinearMethod.apply`) or, as every other method, its input
    columns (when its rows do not divide, or on a device).
    """

    prefix: str
    rows: int
    cols: int
    params_dtype: torch.dtype
    parts: list[NarrowedPart] = attrs.field(factory=list)
    choice: KernelChoice | None = None
    split: RankSplit | None = None
    row_window: tuple[int, int] | None = None
    """``(first row, rows)`` this rank computes over the gathered input; ``None``: the layer's own split."""
    int4: Int4CpuWeight | None = None
    """The packed weight over the layer's current buffers, rebuilt when a buffer is replaced (``module.to``)."""
    segments: list[LayerSegment] = attrs.field(factory=list)
    """A fused layer whose parts need different kernels: one per run of parts on one kernel (else empty)."""


@attrs.frozen(eq=False)
class LayerSegment:
    """Output rows ``[start, start + rows)`` of a fused layer computed by one kernel.

    :ivar kernel: ``int4``, ``int4x2`` or ``dequantized``.
    :ivar weight: an :class:`~loader.kernels.Int4CpuWeight` (``int4``), an
        :class:`~loader.kernels.Int8GroupedWeight` (``int4x2``) or the dense weight ``[rows, cols]``.
    """

    start: int
    rows: int
    kernel: str
    weight: Int4CpuWeight | Int8GroupedWeight | torch.Tensor


@attrs.frozen
class _Decision:
    """What a layer keeps: this rank's tensors (destination row, tensor) in row order, the shape, and why not packed.

    ``row_window`` is set when a row-parallel layer keeps this rank's output rows over every input column.
    """

    tensors: list[tuple[int, CheckpointTensor]]
    types: tuple[str, ...]
    shape: tuple[int, int]
    reason: str | None
    row_window: tuple[int, int] | None = None
    kernel: str = "int4"
    """``int4`` (Q4 blocks) or ``int4x2`` (Q8_0 codes as two int4 planes) when ``reason`` is ``None``;
    the segments' kernels joined by ``+`` (``int4+dequantized``) when :attr:`segments` is set."""
    segments: tuple[_PlannedSegment, ...] = ()
    """A fused layer whose parts need different kernels: its runs of parts, each on its own kernel."""


@attrs.frozen
class _PlannedSegment:
    """A run of consecutive parts on one kernel: its first output row, tensors (in row order), kernel and why
    it is dequantized (``None`` when packed)."""

    start: int
    rows: int
    tensors: list[CheckpointTensor]
    types: tuple[str, ...]
    kernel: str
    reason: str | None = None


FALLBACK = "dequantized"
"""The kernel of a layer no packed kernel takes: its weight dequantized at load."""
_KERNEL_ORDER = ("int4", "int4x2", FALLBACK)


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

    def _decide(self, state: GGUFLayerState, device: torch.device) -> _Decision:
        """This rank's tensors, their block types, the kept shape and why the layer cannot stay packed.

        Decided from the parts' block types, windows and the layer's shape
        alone, before a block is read: the load and :meth:`layer_plan` both
        ask here, so a plan is what the load records. A row-parallel layer at
        tp > 1 keeps this rank's output rows over every input column when
        they can be packed (each rank then computes whole rows, so tp > 1
        adds exactly what tp=1 computes), else its input columns as other
        methods do (packed when that can be, else dequantized).
        """
        parts = sorted(state.parts, key=lambda p: p.offset)
        if sum(p.size for p in parts) != state.rows:
            raise CheckpointFormatError(f"{state.prefix}: its parts fill {sum(p.size for p in parts)} of "
                                        f"{state.rows} rows")
        types = tuple(p.narrowed.stored_type for p in parts)
        own = _Decision([(p.offset, p.narrowed) for p in parts], types, (state.rows, state.cols), None)
        if state.split is not None:  # one part with every input column: this rank's columns, as other methods
            own = attrs.evolve(own, tensors=[(0, parts[0].narrowed.narrow(1, state.split.rank * state.cols,
                                                                          state.cols))])
        if device.type != "cpu":
            return attrs.evolve(own, reason=f"the packed int4 kernel runs on the CPU, not {device}")
        segments = self._segments(state, own, parts) if state.split is None and len(parts) > 1 else ()
        if len(segments) == 1:  # every run dequantized after all: one dense weight, with every run's reason
            return attrs.evolve(own, reason=segments[0].reason)
        if segments:
            kernels = {segment.kernel for segment in segments}
            reasons = [segment.reason for segment in segments if segment.reason is not None]
            return attrs.evolve(own, segments=segments, reason="; ".join(reasons) or None,
                                kernel="+".join(k for k in _KERNEL_ORDER if k in kernels))
        candidates = [own]
        if state.split is not None and state.rows % state.split.size == 0:  # or this rank's rows: first choice
            n = state.rows // state.split.size
            start = state.split.rank * n
            candidates.insert(0, _Decision([(0, parts[0].narrowed.narrow(0, start, n))], types,
                                           (n, state.cols * state.split.size), None, (start, n)))
        reasons = []
        for candidate in candidates:
            choice = self._kernel(state, candidate, parts)
            if choice.reason is None:
                return attrs.evolve(candidate, kernel=choice.kernel)
            reasons.append(choice.reason)
        if len(candidates) == 1:
            return attrs.evolve(own, reason=reasons[0])
        # dequantized too, a row window computes what tp=1 does (no partial sums in a narrow dtype)
        return attrs.evolve(candidates[0], reason=f"this rank's rows: {reasons[0]}; its columns: {reasons[1]}")

    def _part_kernels(self, state: GGUFLayerState, candidate: _Decision,
                      parts: list[NarrowedPart]) -> list[KernelChoice]:
        """Each part's kernel (``int4``, ``int4x2``) or ``dequantized`` with the reason, from its block type."""
        kernels: list[KernelChoice] = []
        for (_, tensor), part in zip(candidate.tensors, parts, strict=True):
            found, kernel = packing_reason(tensor), kernel_for(tensor)
            if found is None and kernel == "int4x2" and self._kernel_dtype(state) == torch.float32:
                found = f"ggml type {tensor.stored_type} runs as two int4 planes only in bfloat16/float16"
            if found is not None and part.shard_id is not None:
                found = f"part {part.shard_id!r}: {found}"
            kernels.append(choose_kernel([KernelOption(kernel, found)], FALLBACK))
        return kernels

    def _kernel(self, state: GGUFLayerState, candidate: _Decision, parts: list[NarrowedPart]) -> KernelChoice:
        """The kernel every part of ``candidate`` can run on, or why the layer is dequantized."""
        kernels = self._part_kernels(state, candidate, parts)
        refused = next((choice for choice in kernels if choice.reason is not None), None)
        if refused is not None:
            return refused
        kernel = kernels[0].kernel
        # parts needing different kernels were split into segments first (:meth:`_segments`)
        assert all(choice.kernel == kernel for choice in kernels), kernels
        return choose_kernel([KernelOption(kernel, self._shape_reason(kernel, *candidate.shape))], FALLBACK)

    @staticmethod
    def _shape_reason(kernel: str, rows: int, cols: int) -> str | None:
        if kernel == "int4x2":
            return int8_grouped_unsupported_reason(rows, cols)
        return int4_unsupported_reason(rows, cols, GROUP_SIZE)

    def _segments(self, state: GGUFLayerState, own: _Decision,
                  parts: list[NarrowedPart]) -> tuple[_PlannedSegment, ...]:
        """A fused layer's runs of consecutive parts on one kernel; empty when its parts share one kernel (or all
        fall back for one reason each, as one dense weight); one dequantized run when the runs that could be
        packed are refused too.

        Why: one call cannot take two kernels, and a Q4_K_M file's ``attn_v`` is
        Q6_K beside Q4_K ``q``/``k`` in about half the layers — dequantizing the
        whole fused layer for it held ``q`` and ``k`` in bfloat16 too. A run the
        kernel refuses (its rows no multiple of 16) is dequantized; adjacent
        dequantized runs are one dense weight.
        """
        kernels = self._part_kernels(state, own, parts)
        if len({choice.kernel for choice in kernels}) < 2:
            return ()
        runs: list[list[int]] = []
        for index, choice in enumerate(kernels):
            if runs and kernels[runs[-1][0]].kernel == choice.kernel:
                runs[-1].append(index)
            else:
                runs.append([index])
        planned: list[_PlannedSegment] = []
        for run in runs:
            kernel = kernels[run[0]].kernel
            rows = sum(parts[i].size for i in run)
            tensors = [own.tensors[i][1] for i in run]
            types = tuple(own.types[i] for i in run)
            reason = "; ".join(str(kernels[i].reason) for i in run) if kernel == FALLBACK else None
            if reason is None and (refused := self._shape_reason(kernel, rows, state.cols)) is not None:
                ids = ", ".join(repr(parts[i].shard_id) for i in run)
                kernel, reason = "dequantized", f"part{'s' if len(run) > 1 else ''} {ids}: {refused}"
            start = planned[-1].start + planned[-1].rows if planned else 0
            if planned and kernel == "dequantized" and planned[-1].kernel == "dequantized":
                last = planned.pop()
                start, rows = last.start, last.rows + rows
                tensors, types = last.tensors + tensors, last.types + types
                reason = f"{last.reason}; {reason}"
            planned.append(_PlannedSegment(start, rows, tensors, types, kernel, reason))
        return tuple(planned)

    def _kernel_dtype(self, state: GGUFLayerState) -> torch.dtype:
        return self.config.kernel_dtype or kernel_dtype_for(state.params_dtype)

    def _dense_dtype(self, state: GGUFLayerState, types: tuple[str, ...]) -> torch.dtype:
        """What a dequantized layer holds: :attr:`GGUFQuantConfig.dense_dtype` when every part is quantized
        blocks, else the layer's dtype (float tensors are not narrowed behind the user's back)."""
        dense = self.config.dense_dtype
        if dense is None or any(t in _FLOAT_TYPE_NAMES for t in types):
            return state.params_dtype
        return dense

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
            state.choice = self._keep_segments(layer, state, decision)
        elif decision.reason is None:
            tensors = [tensor for _, tensor in decision.tensors]
            size = self._keep_packed(layer, "", self._packed(decision.kernel, tensors, self._kernel_dtype(state)))
            state.choice = KernelChoice(decision.kernel, None, decision.types, size)
        else:
            dtype = self._dense_dtype(state, decision.types)
            dense = self._dense([tensor for _, tensor in decision.tensors], decision.shape, dtype, device)
            layer.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
            state.choice = KernelChoice(FALLBACK, decision.reason, decision.types, 0, dtype_name(dtype))
        state.row_window = decision.row_window
        state.parts.clear()
        self.config.layer_log[state.prefix] = state.choice

    def _keep_segments(self, layer: nn.Module, state: GGUFLayerState, decision: _Decision) -> KernelChoice:
        """Each run of parts packed on its kernel or dequantized: buffers ``segment{i}_*``, or ``segment{i}_weight``."""
        kernel_dtype = self._kernel_dtype(state)
        packed_bytes, dense_dtype = 0, None
        for index, segment in enumerate(decision.segments):
            name = f"segment{index}"
            if segment.kernel == "dequantized":
                dtype = self._dense_dtype(state, segment.types)
                dense = self._dense(segment.tensors, (segment.rows, state.cols), dtype, torch.device("cpu"))
                layer.register_parameter(f"{name}_weight", torch.nn.Parameter(dense, requires_grad=False))
                dense_dtype = dense_dtype or dtype_name(dtype)  # the first dense run's, as layer_plan records it
                continue
            packed_bytes += self._keep_packed(layer, f"{name}_",
                                              self._packed(segment.kernel, segment.tensors, kernel_dtype))
        state.segments = self._segment_weights(layer, decision.segments, state.cols)
        return KernelChoice(decision.kernel, decision.reason, decision.types, packed_bytes, dense_dtype)

    def _packed(self, kernel: str, tensors: list[CheckpointTensor], dtype: torch.dtype) -> Int4CpuWeight:
        """``tensors`` (in row order) in torch's int4 layout: Q4 blocks as they are, Q8_0 as its two planes;
        from the packed-weights bundle when an earlier load wrote it (:meth:`GGUFQuantConfig.cached_unit`)."""
        from .packed_cache import unit_key

        made: list[Int4CpuWeight] = []

        def build() -> dict[str, torch.Tensor] | None:
            packed = self._pack_int8(tensors, dtype).planes if kernel == "int4x2" else self._pack(tensors, dtype)
            made.append(packed)
            # an unpacked weight carries its reason, which the bundle does not hold (the kernel took the shape)
            return {"data": packed.data, "scales_and_zeros": packed.scales_and_zeros} if packed.packed else None

        rows = sum(int(tensor.shape[0]) for tensor in tensors) * (2 if kernel == "int4x2" else 1)
        cols = int(tensors[0].shape[-1])
        expected = {"data": (torch.uint8, (rows, cols // 2)),
                    "scales_and_zeros": (dtype, (cols // GROUP_SIZE, rows, 2))}
        unit = self.config.cached_unit(unit_key(kernel, dtype, tensors, self.config.files), build, expected)
        if made:
            return made[0]
        assert unit is not None
        sz = unit["scales_and_zeros"]
        return Int4CpuWeight(unit["data"], sz, GROUP_SIZE, int(sz.shape[0]) * GROUP_SIZE)

    @staticmethod
    def _keep_packed(layer: nn.Module, prefix: str, packed: Int4CpuWeight) -> int:
        """Register ``{prefix}packed_weight`` and ``{prefix}packed_scales_and_zeros``; their bytes."""
        layer.register_buffer(f"{prefix}packed_weight", packed.data)
        layer.register_buffer(f"{prefix}packed_scales_and_zeros", packed.scales_and_zeros)
        sz = packed.scales_and_zeros
        return packed.data.numel() + sz.numel() * sz.element_size()

    @staticmethod
    def _dense(tensors: list[CheckpointTensor], shape: tuple[int, int], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        """``tensors`` (in row order, as :meth:`_pack` takes them) dequantized into one ``shape`` weight."""
        dense = torch.empty(*shape, dtype=dtype, device=device)
        at = 0
        for tensor in tensors:
            rows = int(tensor.shape[0])
            dense[at:at + rows].copy_(tensor.read(dtype))
            at += rows
        return dense

    @staticmethod
    def _kernel_weight(kernel: str, packed: Int4CpuWeight) -> Int4CpuWeight | Int8GroupedWeight:
        """What ``kernel`` multiplies by: the int4 weight itself, or for ``int4x2`` the planes as int8 rows."""
        return Int8GroupedWeight(packed, int(packed.data.shape[0]) // 2) if kernel == "int4x2" else packed

    @staticmethod
    def _packed_bytes(kernel: str, rows: int, cols: int, dtype: torch.dtype) -> int:
        """What :meth:`_keep_packed` will hold, from the shape alone (the ``int4x2`` planes: twice the rows)."""
        from .layer_plan import int4_packed_bytes

        return int4_packed_bytes(2 * rows if kernel == "int4x2" else rows, cols, dtype)

    @staticmethod
    def _segment_weights(layer: nn.Module, planned: Sequence[_PlannedSegment | LayerSegment],
                         cols: int) -> list[LayerSegment]:
        """The segments over the layer's current buffers and parameters (rebuilt after ``module.to``)."""
        segments = []
        for index, segment in enumerate(planned):
            name = f"segment{index}"
            weight: Int4CpuWeight | Int8GroupedWeight | torch.Tensor
            if segment.kernel == "dequantized":
                weight = cast(torch.Tensor, layer._parameters[f"{name}_weight"])
            else:
                data = cast(torch.Tensor, layer._buffers[f"{name}_packed_weight"])
                sz = cast(torch.Tensor, layer._buffers[f"{name}_packed_scales_and_zeros"])
                weight = GGUFLinearMethod._kernel_weight(segment.kernel, Int4CpuWeight(data, sz, GROUP_SIZE, cols))
            segments.append(LayerSegment(segment.start, segment.rows, segment.kernel, weight))
        return segments

    def segments(self, layer: nn.Module) -> list[LayerSegment]:
        """A fused layer's segments (each run of parts on its own kernel), in row order; empty for a layer on one
        kernel (:meth:`int4_weight`) or one dense weight."""
        state = self.layer_state(layer, GGUFLayerState)
        if state.segments and not self._segments_current(layer, state):
            state.segments = self._segment_weights(layer, state.segments, state.cols)
        return list(state.segments)

    @staticmethod
    def _segments_current(layer: nn.Module, state: GGUFLayerState) -> bool:
        """Whether the cached segments still wrap the layer's tensors (``module.to`` replaces them)."""
        for index, segment in enumerate(state.segments):
            weight = segment.weight
            if isinstance(weight, torch.Tensor):
                if layer._parameters.get(f"segment{index}_weight") is not weight:
                    return False
                continue
            packed = weight.planes if isinstance(weight, Int8GroupedWeight) else weight
            if (layer._buffers.get(f"segment{index}_packed_weight") is not packed.data
                    or layer._buffers.get(f"segment{index}_packed_scales_and_zeros") is not packed.scales_and_zeros):
                return False
        return True

    def _apply_segments(self, layer: nn.Module, state: GGUFLayerState, x: torch.Tensor) -> torch.Tensor:
        """Each segment's rows of ``x W^T`` on its own kernel, side by side in ``x``'s dtype."""
        outs = []
        kernel_input: torch.Tensor | None = None
        for segment in self.segments(layer):
            weight = segment.weight
            if isinstance(weight, torch.Tensor):
                outs.append(torch.nn.functional.linear(x.to(weight.dtype), weight).to(x.dtype))
                continue
            if kernel_input is None or kernel_input.dtype != weight.kernel_dtype:
                kernel_input = x.to(weight.kernel_dtype)
            outs.append(weight.matmul(kernel_input).to(x.dtype))
        return torch.cat(outs, dim=-1)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """What :meth:`process_weights_after_loading` will record for this layer, from the GGUF header alone.

        The layer's own loader is handed the checkpoint tensors a load hands it
        (:func:`~loader_plugin_gguf.layer_plan.fill_from_header`: narrowed to
        this rank, nothing read), and :meth:`_decide` answers as at load;
        ``None`` when the header has no tensor for one of the layer's parts
        (the load then says which is missing).
        """
        from loader.models import current_session

        from .layer_plan import fill_from_header

        state = self.layer_state(layer, GGUFLayerState)
        if state.choice is not None:
            return state.choice
        try:
            if not fill_from_header(self.config, layer):
                return None
            decision = self._decide(state, current_session().device)
        finally:
            state.parts.clear()
        if decision.segments:
            kernel_dtype = self._kernel_dtype(state)
            size = sum(self._packed_bytes(s.kernel, s.rows, state.cols, kernel_dtype)
                       for s in decision.segments if s.kernel != "dequantized")
            dense = [s for s in decision.segments if s.kernel == "dequantized"]
            dtype_of = dtype_name(self._dense_dtype(state, dense[0].types)) if dense else None
            return KernelChoice(decision.kernel, decision.reason, decision.types, size, dtype_of)
        if decision.reason is None:
            size = self._packed_bytes(decision.kernel, *decision.shape, self._kernel_dtype(state))
            return KernelChoice(decision.kernel, None, decision.types, size)
        dtype = dtype_name(self._dense_dtype(state, decision.types))
        return KernelChoice(FALLBACK, decision.reason, decision.types, 0, dtype)

    @staticmethod
    def _pack(parts: list[CheckpointTensor], dtype: torch.dtype) -> Int4CpuWeight:
        """The layer's parts (in row order) in torch's int4 layout; Q4_0/Q4_1 without unpacking their nibbles."""
        if all(p.stored_type in _HALF_SPLIT_NAMES for p in parts):
            split = [half_split_rows(p) for p in parts]
            groups = int(split[0].qs.shape[1])
            scales_and_zeros = torch.empty(groups, sum(h.rows for h in split), 2, dtype=dtype)
            start = 0
            for h in split:  # each part's fields straight into the layer's scales, in the kernel's dtype
                h.scales_and_zeros_into(scales_and_zeros, start)
                start += h.rows
            # rows in llama.cpp's q/k order are read where they lie, not copied out first
            return pack_int4_half_split_parts([h.qs for h in split], scales_and_zeros, [h.order for h in split])
        decoded = [affine_rows(p) for p in parts]
        codes = torch.cat([d.codes for d in decoded])
        scales = torch.cat([d.scales for d in decoded], dim=1)
        biases = torch.cat([d.biases for d in decoded], dim=1)
        return pack_int4(codes, scales, biases, GROUP_SIZE, dtype)

    @staticmethod
    def _pack_int8(parts: list[CheckpointTensor], dtype: torch.dtype) -> Int8GroupedWeight:
        """Q8_0 parts (in row order) as the two int4 planes of their codes; one part packs from the file's view."""
        decoded = [int8_rows(p) for p in parts]
        codes = decoded[0].codes if len(decoded) == 1 else torch.cat([d.codes for d in decoded])
        scales = decoded[0].scales if len(decoded) == 1 else torch.cat([d.scales for d in decoded], dim=1)
        return pack_int8_grouped(codes, scales, dtype)

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
        # read from the buffer dict, not Module.__getattr__, and wrapped once: ~6 us of a ~45 us decode call
        buffers = layer._buffers
        data, scales_and_zeros = buffers["packed_weight"], buffers["packed_scales_and_zeros"]
        cached = state.int4
        if cached is None or cached.data is not data or cached.scales_and_zeros is not scales_and_zeros:
            assert data is not None and scales_and_zeros is not None
            # every input column the kernel reads: the layer's own, or all of them for a row window
            cached = Int4CpuWeight(data, scales_and_zeros, GROUP_SIZE, int(scales_and_zeros.shape[0]) * GROUP_SIZE)
            state.int4 = cached
        return GGUFLinearMethod._kernel_weight(state.choice.kernel, cached)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x W^T + b``; a layer keeping its rows over every input column gathers ``x`` and pads with zeros.

        The padded output (this rank's rows, zeros elsewhere) makes the
        row-parallel layer's all-reduce an exact gather: each output is one
        rank's value plus zeros, as tp=1 computes it. A dequantized weight
        narrower than the activations (:attr:`GGUFQuantConfig.dense_dtype`)
        computes in its own dtype, as the packed kernel does.
        """
        state = self.layer_state(layer, GGUFLayerState)
        if state.segments:
            out = self._apply_segments(layer, state, x)
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
            mine = packed.matmul(whole.to(packed.kernel_dtype))
        if state.row_window is None:
            out = mine.to(x.dtype)
        else:
            start, rows = state.row_window
            out = x.new_zeros(*x.shape[:-1], state.rows)
            out[..., start:start + rows] = mine
        return out if bias is None else out + bias.to(out.dtype)
