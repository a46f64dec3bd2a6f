"""``FusedMoE``: every local expert of a mixture-of-experts layer in two 3-D parameters (vLLM's shape).

Gate and up projections of all this rank's experts live in ``w13_*``
(``[experts, 2 * intermediate, hidden]``, gate rows first), down projections
in ``w2_*`` (``[experts, hidden, intermediate]``); the quantize method
(:class:`~loader.layers.moe_method.FusedMoEMethodBase`, asked through the
same ``get_quant_method`` seam as linears) decides what the parameters hold.
Checkpoints name experts one by one (``mlp.experts.7.gate_proj.weight``) or
as one 3-D tensor (GGUF's ``ffn_gate_exps``); :class:`ExpertNames` maps both
onto the parameters, and the layer's expert-aware
``weight_loader(param, tensor, weight_name, shard_id, expert_id)`` narrows
each to this rank's share (:mod:`~loader.layers.expert_placement`): a slice
of every expert's intermediate dimension under tensor parallelism, whole
experts under expert parallelism, where tensors of other ranks' experts are
skipped unread. The layer records what arrived, so a checkpoint missing an
expert is reported by the tensor's name instead of running with garbage.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import attrs
import torch
from torch import nn

from .. import _distributed
from .._mapped_parameters import fill_parameter
from .._session import current_session
from ..errors import ConfigError, MissingWeightsError, ShapeMismatchError, UnexpectedWeightError, UnsupportedError
from .expert_placement import place_experts
from .moe_method import ExpertsShape, fused_moe_method_for
from .moe_router import TopKRouting, select_experts
from .param_layout import ParamLayout, layout_of, param_shape
from .shard_loading import OutputPart, ShardedWeightLoading, ShardId

if TYPE_CHECKING:
    from ..weights import CheckpointTensor
    from .quantization import QuantizationConfig

__all__ = ["ExpertNames", "ExpertTarget", "FusedMoE"]

GATE_UP_SHARDS = ("w1", "w3")
DOWN_SHARDS = ("w2",)


@attrs.frozen
class ExpertTarget:
    """Where one checkpoint tensor of experts lands: the fused parameter, the part and the expert.

    ``expert_id`` is ``None`` for a 3-D tensor holding every expert; ``shard_id`` is ``None`` for a tensor
    holding gate and up already fused (``experts.gate_up_proj``).
    """

    param_name: str
    shard_id: str | None
    expert_id: int | None


class ExpertNames:
    """The checkpoint's names for expert parts (``gate_proj``/``down_proj``/``up_proj``, Mixtral's ``w1``/``w2``/
    ``w3``), mapped onto ``FusedMoE`` parameters.

    ``model.layers.0.mlp.experts.7.gate_proj.weight`` → ``model.layers.0.mlp.experts.w13_weight``, part
    ``"w1"``, expert 7; ``...experts.gate_proj.weight`` (3-D, every expert) → the same parameter, expert
    ``None``; ``...experts.gate_up_proj`` (3-D, fused) → ``w13_weight``, part ``None``.
    """

    def __init__(self, gate: str = "gate_proj", down: str = "down_proj", up: str = "up_proj") -> None:
        self.by_part = {"w1": gate, "w2": down, "w3": up}
        self._shard_of = {gate: "w1", down: "w2", up: "w3"}
        parts = "|".join(re.escape(p) for p in (gate, down, up))
        self._per_expert = re.compile(rf"\.experts\.(\d+)\.({parts})(\.|$)")
        self._all_experts = re.compile(rf"\.experts\.({parts})(\.|$)")
        self._fused = re.compile(r"\.experts\.(gate_up_proj|down_proj)(\.weight)?$")

    def target(self, name: str) -> ExpertTarget | None:
        """Where checkpoint tensor ``name`` lands, or ``None`` when it is not an expert's."""
        match = self._per_expert.search(name)
        if match is not None:
            shard = self._shard_of[match.group(2)]
            return ExpertTarget(self._param(name, match, shard), shard, int(match.group(1)))
        match = self._all_experts.search(name)
        if match is not None:
            shard = self._shard_of[match.group(1)]
            return ExpertTarget(self._param(name, match, shard), shard, None)
        match = self._fused.search(name)
        if match is not None:
            fused = match.group(1) == "gate_up_proj"
            param = f"{name[:match.start()]}.experts.{'w13' if fused else 'w2'}_weight"
            return ExpertTarget(param, None if fused else "w2", None)
        return None

    @staticmethod
    def _param(name: str, match: re.Match[str], shard: str) -> str:
        kind = "w2" if shard == "w2" else "w13"
        rest = name[match.end():]
        return f"{name[:match.start()]}.experts.{kind}_{rest or 'weight'}"

    def checkpoint_name(self, layer_prefix: str, expert_id: int, shard_id: str, suffix: str) -> str:
        """The per-expert checkpoint name of a part (for messages about a missing one)."""
        return f"{layer_prefix}.{expert_id}.{self.by_part[shard_id]}.{suffix}"


class _GateUpRows(ShardedWeightLoading):
    """One expert's gate (``w1``) and up (``w3``) rows on this rank: a merged column-parallel split."""

    def __init__(self, prefix: str, rank: int, count: int, full: int, per_rank: int) -> None:
        self.prefix, self.tp_rank, self.tp_size = prefix, rank, count
        self._full, self._per_rank = full, per_rank

    def _shard_ids(self) -> list[ShardId]:
        return list(GATE_UP_SHARDS)

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id not in GATE_UP_SHARDS:
            raise ValueError(f"experts {self.prefix!r}: gate/up parameters take shard 'w1' or 'w3', got {shard_id!r}")
        offset = 0 if shard_id == "w1" else self._per_rank
        return OutputPart(self.tp_rank * self._per_rank, self._per_rank, offset, self._full)


class _DownCols(ShardedWeightLoading):
    """One expert's down projection on this rank: a row-parallel split of its input (intermediate) columns."""

    _splits_input = True

    def __init__(self, prefix: str, rank: int, count: int, hidden: int) -> None:
        self.prefix, self.tp_rank, self.tp_size, self._hidden = prefix, rank, count, hidden

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        if shard_id != "w2":
            raise ValueError(f"experts {self.prefix!r}: down parameters take shard 'w2', got {shard_id!r}")
        return OutputPart(0, self._hidden, 0, self._hidden)


def _without_expert_dim(layout: ParamLayout) -> ParamLayout:
    """The layout of one expert's 2-D slice: every dimension one lower."""
    def lower(dim: int | None) -> int | None:
        return None if dim is None else dim - 1

    return attrs.evolve(layout, output_dim=lower(layout.output_dim), input_dim=lower(layout.input_dim),
                        packed_dim=lower(layout.packed_dim), logical_shape=None)


def _expert_rows(data: torch.Tensor, *, index: int, has_expert_dim: bool, dim: int | None,
                 rows: tuple[int, int]) -> torch.Tensor:
    """Where local expert ``index``'s part lands in a parameter's ``data``: its rows ``rows`` (offset, size)
    along ``dim``, of ``data[index]`` or, for a part that keeps the expert dimension, of ``data[index:index+1]``.

    A function of the data rather than a view taken once, since mapping the first part may move the data.
    """
    view = data.narrow(0, index, 1) if has_expert_dim else data[index]
    return view if dim is None else view.narrow(dim, *rows)


class FusedMoE(nn.Module):
    """This rank's experts of one MoE layer, routed top-k; the forward runs only the experts tokens chose.

    :param num_experts: the checkpoint's experts (global).
    :param top_k: experts per token.
    :param hidden_size: the model's hidden size.
    :param intermediate_size: one expert's intermediate size (``moe_intermediate_size``).
    :param renormalize: rescale the chosen routing weights to sum to one.
    :param names: the checkpoint's names for the expert parts (default ``gate_proj``/``down_proj``/``up_proj``).
    :param reduce_results: sum the ranks' partial outputs here (``False``: the caller reduces).
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        renormalize: bool = True,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        names: ExpertNames | None = None,
        reduce_results: bool = True,
    ) -> None:
        super().__init__()
        session = current_session()
        self.prefix = prefix
        what = prefix or "FusedMoE"
        self.placement = place_experts(num_experts, session.tp_rank, session.tp_size,
                                       expert_parallel=session.enable_expert_parallel, what=what)
        if not 0 < top_k <= num_experts:
            raise ConfigError(f"{what}: num_experts_per_tok={top_k} must be between 1 and num_experts={num_experts}")
        self.routing = TopKRouting(top_k, renormalize)
        self.names = names if names is not None else ExpertNames()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        per_rank = _distributed.divide(intermediate_size, self.placement.slice_count,
                                       f"{what}: moe_intermediate_size")
        self.intermediate_size_per_partition = per_rank
        self.tp_size = session.tp_size
        self.reduce_results = reduce_results
        self._gate_up = _GateUpRows(what, self.placement.slice_rank, self.placement.slice_count,
                                    intermediate_size, per_rank)
        self._down = _DownCols(what, self.placement.slice_rank, self.placement.slice_count, hidden_size)
        self._arrived: dict[str, set[tuple[int, str]]] = {}
        self._lock = threading.Lock()
        self.quant_method = fused_moe_method_for(quant_config, self, prefix)
        self.quant_method.create_weights(self, ExpertsShape(
            num_local_experts=self.placement.num_local_experts, hidden_size=hidden_size,
            intermediate_size_per_partition=per_rank, intermediate_size=intermediate_size,
            params_dtype=params_dtype if params_dtype is not None else session.dtype,
            weight_loader=self.weight_loader,
        ))

    @property
    def num_experts(self) -> int:
        return self.placement.num_experts

    @property
    def num_local_experts(self) -> int:
        return self.placement.num_local_experts

    def extra_repr(self) -> str:
        p = self.placement
        return (f"experts={p.num_experts}, local={p.first_expert}..{p.first_expert + p.num_local_experts - 1}, "
                f"top_k={self.routing.top_k}, hidden={self.hidden_size}, intermediate={self.intermediate_size}"
                f"/{p.slice_count}, expert_parallel={p.expert_parallel}")

    # -- loading --------------------------------------------------------------------------------------

    def weight_loader(self, param: torch.Tensor, loaded: CheckpointTensor, weight_name: str = "",
                      shard_id: str | None = None, expert_id: int | None = None) -> None:
        """Land checkpoint tensor ``loaded`` (named ``weight_name``) in ``param``: part ``shard_id``
        (``"w1"`` gate, ``"w3"`` up, ``"w2"`` down; ``None``: gate and up fused) of expert ``expert_id``
        (``None``: a 3-D tensor of every expert, experts outermost).

        Experts held by another rank are skipped without reading a byte. A parameter whose layout has a
        ``load_part`` (a quantize method's own landing: checks, quantize on load) gets each expert's narrowed
        part there instead of a copy, with ``part.expert`` the local expert; such parameters take one tensor
        per expert.

        :raises UnexpectedWeightError: an expert id outside ``0..num_experts-1``.
        :raises ShapeMismatchError: a tensor whose shape (or expert count) is not the expert's.
        """
        param_name = self._name_of(param)
        shards = GATE_UP_SHARDS if param_name.startswith("w13_") else DOWN_SHARDS
        described = loaded.describe() if not weight_name or weight_name in loaded.describe() \
            else f"{loaded.describe()} (as {weight_name!r})"
        if shard_id is None and shards == GATE_UP_SHARDS:
            self._load_fused_gate_up(param, loaded, described, expert_id)
            return
        if shard_id is None or shard_id not in shards:
            raise ValueError(f"{self.prefix}.{param_name} takes parts {shards}, got {shard_id!r}")
        if expert_id is None:
            self._load_all_experts(param, loaded, described, shard_id)
            return
        if not 0 <= expert_id < self.num_experts:
            raise UnexpectedWeightError(
                f"{described}: expert {expert_id} is out of range, the config says num_experts="
                f"{self.num_experts} (experts 0..{self.num_experts - 1})")
        index = self.placement.local_index(expert_id)
        if index is None:
            return  # another rank's expert: not read here
        self._land(param, loaded, shard_id, index, has_expert_dim=False)
        self._record(param_name, expert_id, shard_id)

    def _load_all_experts(self, param: torch.Tensor, loaded: CheckpointTensor, described: str, shard_id: str) -> None:
        if loaded.ndim != param.ndim or loaded.shape[0] != self.num_experts:
            raise ShapeMismatchError(
                f"{described}: a tensor of every expert needs {self.num_experts} experts (num_experts) along "
                f"dim 0 and {param.ndim} dimensions, found shape {tuple(loaded.shape)}")
        name = self._name_of(param)
        for index, expert in enumerate(self.placement.local_experts):
            self._land(param, loaded.narrow(0, expert, 1), shard_id, index, has_expert_dim=True)
            self._record(name, expert, shard_id)

    def _load_fused_gate_up(self, param: torch.Tensor, loaded: CheckpointTensor, described: str,
                            expert_id: int | None) -> None:
        """``experts.gate_up_proj``: gate rows then up rows along the output dimension, loaded as two parts."""
        output_dim = layout_of(param).output_dim
        if output_dim is None:
            raise ValueError(f"{self.prefix}.{self._name_of(param)} has no output dimension to split gate/up along")
        dim = output_dim if expert_id is None else output_dim - 1
        rows = loaded.shape[dim] if dim < loaded.ndim else 0
        if rows % 2:
            raise ShapeMismatchError(f"{described}: fused gate/up rows ({rows}) are not two equal parts")
        for part, shard in enumerate(GATE_UP_SHARDS):
            half = loaded.narrow(dim, part * rows // 2, rows // 2)
            self.weight_loader(param, half, described, shard, expert_id)

    def _land(self, param: torch.Tensor, loaded: CheckpointTensor, shard_id: str, index: int, *,
              has_expert_dim: bool) -> None:
        layout = layout_of(param)
        shape = param_shape(param, layout)
        split = self._gate_up if shard_id in GATE_UP_SHARDS else self._down
        if has_expert_dim:
            if layout.load_part is not None:
                raise UnsupportedError(
                    f"{loaded.describe()}: {self.prefix}.{self._name_of(param)} lands each expert's tensor its own "
                    "way and takes experts one tensor each, not a 3-D tensor of every expert")
            part = split.narrow_part(layout, (1, *shape[1:]), loaded, shard_id)
            output_dim = layout.output_dim
        else:
            flat = _without_expert_dim(layout)
            part = split.narrow_part(flat, shape[1:], loaded, shard_id)
            if layout.load_part is not None:  # a quantize method's own landing (checks, quantize on load)
                layout.load_part(param, attrs.evolve(part, expert=index))
                return
            output_dim = flat.output_dim
        # Mapped from the file where it can be (an expert's rows are one run of bytes in both), each part
        # paid for from the process's budget of memory maps (loader._map_budget), else copied.
        fill_parameter(param, part.narrowed, locate=partial(
            _expert_rows, index=index, has_expert_dim=has_expert_dim, dim=output_dim, rows=(part.offset, part.size)))

    def _name_of(self, param: torch.Tensor) -> str:
        for name, own in self.named_parameters(recurse=False):
            if own is param:
                return name
        raise ValueError(f"{type(self).__name__} {self.prefix!r}: the parameter given is not one of this layer's")

    def _record(self, param_name: str, expert_id: int, shard_id: str) -> None:
        with self._lock:
            self._arrived.setdefault(param_name, set()).add((expert_id, shard_id))

    def loaded_parameters(self) -> set[str]:
        """The names of this layer's parameters every local expert's every part arrived in.

        :raises MissingWeightsError: a parameter some parts arrived in but not all, naming the checkpoint
            tensors still missing (an expert absent from the checkpoint, or ``num_experts`` in the config
            larger than the checkpoint's).
        """
        filled = set()
        for name, _ in self.named_parameters(recurse=False):
            arrived = self._arrived.get(name)
            if not arrived:
                continue
            shards = GATE_UP_SHARDS if name.startswith("w13_") else DOWN_SHARDS
            expected = {(e, s) for e in self.placement.local_experts for s in shards}
            missing = sorted(expected - arrived)
            if missing:
                suffix = name.split("_", 1)[1]
                shown = [self.names.checkpoint_name(self.prefix, e, s, suffix) for e, s in missing[:5]]
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                raise MissingWeightsError(
                    f"the experts {self.prefix!r} (num_experts={self.num_experts}) lack "
                    f"{', '.join(repr(n) for n in shown)}{more} in the checkpoint")
            filled.add(name)
        return filled

    # -- forward --------------------------------------------------------------------------------------

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``[tokens, hidden]`` -> ``[tokens, hidden]``: each token's ``top_k`` experts, weighted and summed."""
        weights, ids = select_experts(router_logits, self.routing)
        if not self.placement.is_complete:
            local = ids - self.placement.first_expert
            ids = torch.where((local >= 0) & (local < self.placement.num_local_experts), local, -1)
        out = self.quant_method.apply(self, hidden, weights, ids)
        if self.reduce_results and self.tp_size > 1:
            out = _distributed.all_reduce(out)
        return out

    @staticmethod
    def make_expert_params_mapping(ckpt_gate_proj_name: str, ckpt_down_proj_name: str, ckpt_up_proj_name: str,
                                   num_experts: int) -> list[tuple[str, str, int, str]]:
        """vLLM's table: ``(param_prefix, checkpoint_infix, expert_id, shard_id)`` for every expert part,
        e.g. ``("experts.w13_", "experts.7.gate_proj.", 7, "w1")`` (a model replaces the infix by the
        prefix). :class:`ExpertNames` answers the same question by pattern, for any expert count."""
        parts: Sequence[tuple[str, str]] = (("w1", ckpt_gate_proj_name), ("w2", ckpt_down_proj_name),
                                            ("w3", ckpt_up_proj_name))
        return [("experts.w2_" if shard == "w2" else "experts.w13_", f"experts.{expert}.{name}.", expert, shard)
                for expert in range(num_experts) for shard, name in parts]
