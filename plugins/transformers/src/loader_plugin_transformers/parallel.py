"""Swap a transformers model's linear layers for loader's, to shard or quantize them.

Only done when needed (tensor parallelism or a quantization config): a plain
load keeps transformers' own modules, so its math is transformers' to the bit.

Sharding follows the config's ``base_model_tp_plan`` (transformers' own
statement of which layers split how): ``colwise`` becomes a
:class:`~loader.layers.ColumnParallelLinear` whose output stays split,
``rowwise`` a :class:`~loader.layers.RowParallelLinear` that all-reduces,
``colwise_gather_output`` a column-parallel layer that gathers its output, and
``rowwise_split_input`` a row-parallel layer that takes its own slice of a
replicated input. Linear layers the plan does not name stay whole on every
rank (column-parallel with a gather, so each rank still reads only its rows;
one with fewer outputs than ranks, unquantized, stays transformers' own).
The output head is left to transformers (it may be tied to the embedding).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loader.errors import UnsupportedError
from loader.layers import ColumnParallelLinear, LinearBase, RowParallelLinear
from loader.models import current_session, divide

if TYPE_CHECKING:
    from loader.layers import OutputPart, QuantizationConfig

__all__ = ["ReplicatedHeadsLinear", "SplitInputRowParallelLinear", "plan_style", "swap_linears"]

SUPPORTED_STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input")


class SplitInputRowParallelLinear(RowParallelLinear):
    """A row-parallel layer fed the whole input: each rank multiplies its own slice of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            x = x.narrow(-1, self.tp_rank * self.input_size_per_partition, self.input_size_per_partition)
        return super().forward(x)


class ReplicatedHeadsLinear(ColumnParallelLinear):
    """A key or value projection with fewer heads than ranks: each rank holds the one head its queries use.

    As vLLM (and loader's native ``QKVParallelLinear``) do, head ``h`` is
    replicated on ``tp / heads`` consecutive ranks; rank ``r`` reads only the
    rows of head ``r // (tp / heads)``.
    """

    def __init__(self, input_size: int, output_size: int, *, num_heads: int, **kwargs: object) -> None:
        tp = current_session().tp_size
        self.head_size = divide(output_size, num_heads, f"{kwargs.get('prefix', '')}: output rows per head")
        self.replicas = divide(tp, num_heads, f"{kwargs.get('prefix', '')}: ranks per key/value head")
        super().__init__(input_size, self.head_size * tp, **kwargs)  # type: ignore[arg-type]
        self.output_size = output_size  # the checkpoint tensor's rows; each rank holds head_size of them

    def _output_part(self, shard_id: object) -> OutputPart:
        part = super()._output_part(shard_id)  # type: ignore[arg-type]
        start = (self.tp_rank // self.replicas) * self.head_size
        return type(part)(start, self.head_size, 0, self.output_size)


def plan_style(name: str, plan: Mapping[str, str]) -> str | None:
    """The plan's style for module ``name`` (relative to the base model; ``*`` matches one index)."""
    for pattern, style in plan.items():
        if re.fullmatch(re.escape(pattern).replace(r"\*", r"\d+"), name):
            return style
    return None


def _conv1d_type() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def _sizes(module: nn.Module) -> tuple[int, int, bool]:
    """``(in_features, out_features, has_bias)`` of an ``nn.Linear`` or a ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features, module.bias is not None
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return int(weight.shape[0]), int(weight.shape[1]), getattr(module, "bias", None) is not None


def _layer(style: str | None, sizes: tuple[int, int, bool], dtype: torch.dtype,
           quant_config: QuantizationConfig | None, prefix: str) -> LinearBase:
    in_features, out_features, bias = sizes
    common = dict(bias=bias, params_dtype=dtype, quant_config=quant_config, prefix=prefix)
    if style == "colwise":
        return ColumnParallelLinear(in_features, out_features, gather_output=False, **common)  # type: ignore[arg-type]
    if style == "rowwise":
        return RowParallelLinear(in_features, out_features, **common)  # type: ignore[arg-type]
    if style == "rowwise_split_input":
        return SplitInputRowParallelLinear(in_features, out_features, **common)  # type: ignore[arg-type]
    return ColumnParallelLinear(in_features, out_features, gather_output=True, **common)  # type: ignore[arg-type]


def check_head_split(config: object, architecture: str, tp: int) -> bool:
    """Heads must split over ranks (transformers' attention infers this rank's head count from its rows).

    Query heads must divide evenly; key/value heads either divide evenly or,
    fewer than the ranks, are replicated (tp a multiple of them). Returns
    whether they are replicated.
    """
    heads = getattr(config, "num_attention_heads", None)
    if isinstance(heads, int):
        divide(heads, tp, f"{architecture}: num_attention_heads")
    kv_heads = getattr(config, "num_key_value_heads", None)
    if not isinstance(kv_heads, int) or kv_heads >= tp or kv_heads == 0:
        if isinstance(kv_heads, int):
            divide(kv_heads, tp, f"{architecture}: num_key_value_heads")
        return False
    divide(tp, kv_heads, f"{architecture}: tensor parallel size {tp} replicating num_key_value_heads")
    return True


_KV_PROJECTIONS = ("k_proj", "v_proj")


def swap_linears(hf_model: nn.Module, *, architecture: str, plan: Mapping[str, str] | None,
                 quant_config: QuantizationConfig | None, dtype: torch.dtype) -> set[str]:
    """Replace the linear layers of ``hf_model`` (except the output head); return the swapped ``Conv1D`` names.

    Raises :class:`~loader.errors.UnsupportedError` naming the architecture when
    tp > 1 and the config declares no plan, the heads do not split evenly, or
    the plan uses a style this fallback does not shard.
    """
    tp = current_session().tp_size
    if tp == 1 and quant_config is None:
        return set()
    if tp > 1 and not plan:
        raise UnsupportedError(
            f"{architecture}: tensor parallel size {tp} needs a base_model_tp_plan in its transformers config, and "
            f"{architecture} declares none; load it with tp=1 or through a native model plugin"
        )
    config = getattr(hf_model, "config", None)
    replicate_kv = tp > 1 and check_head_split(config, architecture, tp)
    conv1d = _conv1d_type()
    kinds = (nn.Linear,) if conv1d is None else (nn.Linear, conv1d)
    get_head = getattr(hf_model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    base_prefix = str(getattr(hf_model, "base_model_prefix", "") or "")
    swapped_conv1d: set[str] = set()
    replicated = 0
    for name, module in list(hf_model.named_modules()):
        if not isinstance(module, kinds) or module is head:
            continue
        relative = name.removeprefix(f"{base_prefix}.") if base_prefix else name
        style = plan_style(relative, plan or {}) if tp > 1 else None
        if style is not None and style not in SUPPORTED_STYLES:
            raise UnsupportedError(
                f"{architecture}: base_model_tp_plan gives {relative} the style {style!r}; the transformers "
                f"fallback shards only {', '.join(SUPPORTED_STYLES)}"
            )
        assert isinstance(module, nn.Module)
        if style is None and quant_config is None and _sizes(module)[1] % tp:
            continue  # unplanned and too narrow to split (a shared expert's one-output gate): kept whole
        if replicate_kv and name.rsplit(".", 1)[-1] in _KV_PROJECTIONS:
            layer = _replicated_kv_layer(style, _sizes(module), dtype, quant_config, name, config, architecture)
            replicated += 1
        else:
            layer = _layer(style, _sizes(module), dtype, quant_config, name)
        hf_model.set_submodule(name, layer)
        if conv1d is not None and isinstance(module, conv1d):
            swapped_conv1d.add(name)
    if replicate_kv and not replicated:
        raise UnsupportedError(
            f"{architecture}: num_key_value_heads={getattr(config, 'num_key_value_heads', None)} is fewer than "
            f"tensor parallel size "
            f"{tp}, and its key/value projections are not separate k_proj/v_proj modules (a fused qkv cannot "
            "replicate its heads); load it with a tp that divides num_key_value_heads"
        )
    if replicate_kv:  # each rank's query heads now share its one key/value head
        heads_per_rank = int(getattr(config, "num_attention_heads", 0)) // tp
        for module in hf_model.modules():
            if hasattr(module, "num_key_value_groups"):
                vars(module)["num_key_value_groups"] = heads_per_rank
    return swapped_conv1d


def _replicated_kv_layer(style: str | None, sizes: tuple[int, int, bool], dtype: torch.dtype,
                         quant_config: QuantizationConfig | None, prefix: str, config: Any,
                         architecture: str) -> LinearBase:
    """The layer for a k/v projection whose heads are fewer than the ranks (its plan style must be ``colwise``)."""
    if style != "colwise":
        raise UnsupportedError(
            f"{architecture}: {prefix} has {getattr(config, 'num_key_value_heads', '?')} key/value heads, fewer than "
            f"the {current_session().tp_size} ranks, and its plan style {style!r} is not colwise; only a colwise "
            "projection can replicate its heads"
        )
    in_features, out_features, bias = sizes
    return ReplicatedHeadsLinear(in_features, out_features, num_heads=int(config.num_key_value_heads),
                                 bias=bias, params_dtype=dtype, quant_config=quant_config, prefix=prefix)
