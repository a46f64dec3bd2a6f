"""Tensor-parallel linear layers whose parameters come from a quantize method.

A layer decides *which rows or columns* of a checkpoint tensor belong to this
rank and *where* they land in its (possibly fused) parameter; the quantize
method decides *what* the parameters are and how the math runs. The split
lives in one place, :class:`~loader.layers.shard_loading.ShardedWeightLoading`
(``shard_slice`` and the layers' ``weight_loader``), which quantization
plugins reuse, so the TP arithmetic is never duplicated. This module holds
the layers themselves: their per-rank sizes, parts and forward math.

Rank and size are read from :mod:`loader._distributed` when a layer is built;
wrap construction in :func:`loader._distributed.simulated_tp` to build another
rank's shard in a single process (tests do).

Units along ``output_dim`` are logical output features, divided by
``pack_factor`` for parameters packed along that dimension (``packed_dim``).
Along ``input_dim`` the parameter's own per-rank extent is the shard size, so
packed or grouped parameters (scales per group) narrow correctly too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .. import _distributed
from .._session import current_session
from ..errors import UnsupportedError
from .param_layout import ParamLayout, set_param_layout
from .quantization import LinearMethodBase, LinearShape, linear_method_for
from .shard_loading import OutputPart, ShardedWeightLoading, ShardId

if TYPE_CHECKING:
    from .quantization import QuantizationConfig

__all__ = [
    "ColumnParallelLinear",
    "LinearBase",
    "MergedColumnParallelLinear",
    "OutputPart",
    "QKVParallelLinear",
    "ReplicatedLinear",
    "RowParallelLinear",
    "ShardId",
]


class LinearBase(ShardedWeightLoading, nn.Module):
    """Common construction, quantize-method choice and weight loading of the parallel linears.

    Subclasses compute their per-rank sizes, call :meth:`_create_weights`,
    and describe their split through :meth:`_output_part` and
    :attr:`_splits_input`.
    """

    quant_method: LinearMethodBase
    bias: nn.Parameter | None

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        session = current_session()
        self.params_dtype = params_dtype if params_dtype is not None else session.dtype
        self.quant_config = quant_config
        self.prefix = prefix
        self.tp_rank = session.tp_rank
        self.tp_size = session.tp_size

    def _label(self, field: str) -> str:
        return f"{self.display_name} {field}"

    def _create_weights(
        self, input_size_per_partition: int, output_partition_sizes: list[int], bias_size: int | None
    ) -> None:
        """Ask the quantize method for the weights; create the bias (``bias_size`` rows) if any."""
        self.input_size_per_partition = input_size_per_partition
        self.output_partition_sizes = list(output_partition_sizes)
        self.quant_method = linear_method_for(self.quant_config, self, self.prefix)
        self.quant_method.create_weights(self, LinearShape(
            input_size_per_partition=input_size_per_partition,
            output_partition_sizes=output_partition_sizes,
            input_size=self.input_size,
            output_size=self.output_size,
            params_dtype=self.params_dtype,
            weight_loader=self.weight_loader,
        ))
        if bias_size is None:
            self.register_parameter("bias", None)
            return
        bias = nn.Parameter(torch.empty(bias_size, dtype=self.params_dtype), requires_grad=False)
        set_param_layout(bias, ParamLayout(weight_loader=self.weight_loader, output_dim=0))
        self.register_parameter("bias", bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.input_size}, out_features={self.output_size}, "
            f"tp_rank={self.tp_rank}, tp_size={self.tp_size}, bias={self.bias is not None}"
        )


class ReplicatedLinear(LinearBase):
    """``y = x W^T + b`` with the whole weight on every rank (a MoE router, Qwen2-MoE's shared-expert gate).

    Small layers whose output every rank needs in full: splitting them would
    cost a gather for a few hundred columns.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            input_size, output_size, params_dtype=params_dtype, quant_config=quant_config, prefix=prefix
        )
        self._create_weights(input_size, [output_size], output_size if bias else None)

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id is not None:
            raise ValueError(f"ReplicatedLinear {self.prefix!r} has no shard {shard_id!r}")
        return OutputPart(0, self.output_size, 0, self.output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """``y = x W^T + b`` with the rows of ``W`` (output features) split over ranks.

    Each rank computes its slice of the output; ``gather_output=True``
    all-gathers it so every rank holds the full output.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = False,
        gather_output: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        output_sizes: list[int] | None = None,
    ) -> None:
        """``output_sizes`` lists the fused parts (full sizes) when the subclass fuses several outputs."""
        super().__init__(
            input_size, output_size, params_dtype=params_dtype, quant_config=quant_config, prefix=prefix
        )
        self.gather_output = gather_output
        sizes = output_sizes if output_sizes is not None else [output_size]
        partition_sizes = [
            _distributed.divide(s, self.tp_size, self._label("output_size")) for s in sizes
        ]
        self.output_size_per_partition = sum(partition_sizes)
        self._create_weights(input_size, partition_sizes, self.output_size_per_partition if bias else None)

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} {self.prefix!r} has no shard {shard_id!r}")
        length = self.output_size_per_partition
        return OutputPart(self.tp_rank * length, length, 0, self.output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, x, self.bias)
        if self.gather_output and self.tp_size > 1:
            out = self._gather(out)
        return out

    def _gather(self, out: torch.Tensor) -> torch.Tensor:
        gathered = _distributed.all_gather(out, dim=-1)
        if len(self.output_partition_sizes) == 1:
            return gathered
        # rank-major [r0: p0 p1, r1: p0 p1] -> part-major [p0: r0 r1, p1: r0 r1]
        per_rank = [chunk.split(self.output_partition_sizes, dim=-1)
                    for chunk in gathered.split(self.output_size_per_partition, dim=-1)]
        parts = [piece for i in range(len(self.output_partition_sizes)) for piece in
                 (chunks[i] for chunks in per_rank)]
        return torch.cat(parts, dim=-1)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one weight (gate and up projections).

    Part ``i`` of ``output_sizes`` is loaded with ``shard_id=i``; each rank
    holds its slice of every part, parts stacked in order.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        *,
        bias: bool = False,
        gather_output: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(
            input_size, sum(output_sizes), bias=bias, gather_output=gather_output,
            params_dtype=params_dtype, quant_config=quant_config, prefix=prefix, output_sizes=output_sizes,
        )

    def _shard_ids(self) -> list[ShardId]:
        return list(range(len(self.output_sizes)))

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"{type(self).__name__} {self.prefix!r}: shard_id must be 0..{len(self.output_sizes) - 1}, "
                f"got {shard_id!r}"
            )
        length = self.output_partition_sizes[shard_id]
        offset = sum(self.output_partition_sizes[:shard_id])
        return OutputPart(self.tp_rank * length, length, offset, self.output_sizes[shard_id])


class QKVParallelLinear(ColumnParallelLinear):
    """Query, key and value projections fused, split by heads (shard ids ``"q"``, ``"k"``, ``"v"``).

    With fewer KV heads than ranks, each KV head is replicated on
    ``num_kv_head_replicas`` consecutive ranks (tp must then be a multiple of
    the KV heads). ``num_heads``, ``num_kv_heads``, ``q_size`` and ``kv_size``
    are per rank. ``output_size`` is the checkpoint's fused size,
    ``(total_num_heads + 2 * total_num_kv_heads) * head_size``.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        *,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        tp = current_session().tp_size
        total_num_kv_heads = total_num_heads if total_num_kv_heads is None else total_num_kv_heads
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = _distributed.divide(total_num_heads, tp, "num_attention_heads")
        if tp >= total_num_kv_heads:
            if tp % total_num_kv_heads:
                raise UnsupportedError(
                    f"tensor parallel size {tp} is not a multiple of num_key_value_heads="
                    f"{total_num_kv_heads} (key/value heads can only be replicated evenly)"
                )
            self.num_kv_heads = 1
            self.num_kv_head_replicas = tp // total_num_kv_heads
        else:
            self.num_kv_heads = _distributed.divide(total_num_kv_heads, tp, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        # per-rank parts are given directly: kv parts are not tp-divided when replicated
        super().__init__(
            hidden_size, (total_num_heads + 2 * total_num_kv_heads) * head_size, bias=bias,
            params_dtype=params_dtype, quant_config=quant_config, prefix=prefix,
            output_sizes=[self.q_size * tp, self.kv_size * tp, self.kv_size * tp],
        )

    def _shard_ids(self) -> list[ShardId]:
        return ["q", "k", "v"]

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id == "q":
            return OutputPart(self.tp_rank * self.q_size, self.q_size, 0,
                               self.total_num_heads * self.head_size)
        if shard_id in ("k", "v"):
            start = (self.tp_rank // self.num_kv_head_replicas) * self.kv_size
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            return OutputPart(start, self.kv_size, offset, self.total_num_kv_heads * self.head_size)
        raise ValueError(
            f"QKVParallelLinear {self.prefix!r}: shard_id must be 'q', 'k' or 'v', got {shard_id!r}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class RowParallelLinear(LinearBase):
    """``y = x W^T + b`` with the columns of ``W`` (input features) split over ranks.

    The input arrives already split (the output of a column-parallel layer);
    partial products are summed with an all-reduce and the bias is added once,
    after the sum. With ``reduce_results=False`` the caller reduces, and only
    rank 0 adds the bias so the later sum counts it once.
    """

    _splits_input = True

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = False,
        reduce_results: bool = True,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            input_size, output_size, params_dtype=params_dtype, quant_config=quant_config, prefix=prefix
        )
        self.reduce_results = reduce_results
        per_rank = _distributed.divide(input_size, self.tp_size, self._label("input_size"))
        self._create_weights(per_rank, [output_size], output_size if bias else None)

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id is not None:
            raise ValueError(f"RowParallelLinear {self.prefix!r} has no shard {shard_id!r}")
        return OutputPart(0, self.output_size, 0, self.output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        if not self.reduce_results:
            return self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)
        out = _distributed.all_reduce(self.quant_method.apply(self, x, None))
        if self.bias is not None:
            out = out + self.bias
        return out
