"""The seam between layers and quantization plugins.

A quantization plugin returns a :class:`QuantizationConfig` subclass from
``loader_detect_quantization``; each quantizable layer then asks that config
for its method (``get_quant_method(layer, prefix)``, vLLM's shape) — the
layers never reach back into the hook machinery. A layer never creates its
own parameters: it asks its quantize method to (``create_weights``, handed
the layer's sizes as one record: :class:`LinearShape` or :class:`EmbeddingShape`),
routes its forward through ``apply``, and the pipeline calls
``process_weights_after_loading`` once every tensor is in. Model plugins never
see the difference.

Skip lists are written against checkpoint names (``q_proj``) while the model
holds fused layers (``qkv_proj``). The pipeline hands the model's fused-module
table to the config (:meth:`QuantizationConfig.set_packed_modules`) before any
layer is built, and :meth:`QuantizationConfig.skip` maps between the two once
for every plugin: a plugin only says which names its own list covers
(:meth:`QuantizationConfig.ignores`).
"""

from __future__ import annotations

import abc
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from ..errors import FusedLayerSkipError, LoadError, PluginError
from ..kernels.choice import KernelChoice
from .param_layout import ParamLayout, WeightLoader, set_param_layout

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..weights import WeightStream

__all__ = ["EmbeddingMethodBase", "EmbeddingShape", "LinearMethodBase", "LinearShape", "QuantizationConfig",
           "QuantizeMethodBase", "UnquantizedLinearMethod", "WeightLoader", "embedding_method_for",
           "linear_method_for", "method_name_of", "quant_method_asked"]

_PACKED_MODULES = "_loader_packed_modules"


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@attrs.frozen
class LinearShape:
    """What a linear layer tells its quantize method's :meth:`~LinearMethodBase.create_weights`.

    Built once by the layer (``LinearBase`` and a quantized ``ParallelLMHead``);
    a method reads the fields it needs (``shape.input_size_per_partition``).

    :ivar input_size_per_partition: this rank's input features.
    :ivar output_partition_sizes: this rank's output rows of each fused part
        (one entry for a plain linear, q/k/v or gate/up for fused ones).
    :ivar input_size: the full input features.
    :ivar output_size: the full output features.
    :ivar params_dtype: the dtype of unquantized parameters.
    :ivar weight_loader: the layer's loader, to put in each parameter's
        :class:`~loader.layers.param_layout.ParamLayout` (or wrap) so
        checkpoint tensors land in the right shard. A method whose parameters
        are not plain copies of the checkpoint rows keeps this loader (fused
        tensors are split, shapes checked and rows narrowed to this rank by
        the layer) and sets the layout's ``load_part`` to land each narrowed
        part itself.
    """

    input_size_per_partition: int
    output_partition_sizes: tuple[int, ...] = attrs.field(converter=_int_tuple)
    input_size: int
    output_size: int
    params_dtype: torch.dtype
    weight_loader: WeightLoader

    @property
    def output_size_per_partition(self) -> int:
        """This rank's output rows over every part (the rows of a dense weight)."""
        return sum(self.output_partition_sizes)


@attrs.frozen
class EmbeddingShape:
    """What a vocabulary embedding tells its quantize method's :meth:`~EmbeddingMethodBase.create_weights`.

    :ivar rows_per_partition: this rank's vocabulary rows (padded).
    :ivar embedding_dim: the width of a row.
    :ivar params_dtype: the dtype of unquantized parameters.
    :ivar weight_loader: the layer's loader: it checks the checkpoint tensor's
        shape, narrows it to this rank's rows and, when the parameter's layout
        has a ``load_part``, hands the narrowed rows there instead of copying.
    """

    rows_per_partition: int
    embedding_dim: int
    params_dtype: torch.dtype
    weight_loader: WeightLoader


class QuantizationConfig:
    """A checkpoint's (or a request's) quantization settings, owned by one plugin (subclass it).

    Subclasses implement :meth:`get_quant_method` and, when they have a skip
    list, :meth:`ignores`. They may be ``attrs.frozen``: the fused-module table
    is stored beside their fields, not as one.
    """

    #: the method name users pass as ``quantization=``; also shown by ``loader inspect``.
    name: ClassVar[str] = ""

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary for ``loader inspect`` and load reports."""
        return {"method": self.name}

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The quantize method of the layer at ``prefix``, or ``None`` to leave it unquantized.

        Called while the model is built (on the ``meta`` device) for every
        quantizable layer that :meth:`skip` does not keep unquantized; return
        ``None`` for layer kinds this config does not handle.

        :param layer: the layer being built (a ``LinearBase`` subclass for linears).
        :param prefix: the layer's dotted name in the model, e.g. ``model.layers.0.mlp.down_proj``.
        """
        return None

    def layer_scheme(self, prefix: str) -> str | None:
        """How the checkpoint quantizes the layer at ``prefix`` when a config holds several schemes (a
        compressed-tensors group: ``"attention: pack-quantized w8 int channel"``); ``loader inspect --layers``
        shows it beside the layer's kernel. Asked after the model is built; default: ``None`` (one scheme)."""
        return None

    # -- the model's fused modules and the skip decision ---------------------------------------------

    def set_packed_modules(self, mapping: Mapping[str, Sequence[str]]) -> None:
        """Record the model's fused-module table (``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``).

        The pipeline calls this with the model class's ``packed_modules_mapping``
        before the model is built, as vLLM does, so :meth:`skip` can answer for
        fused layers from a list written in checkpoint names.
        """
        table = types.MappingProxyType({str(fused): tuple(parts) for fused, parts in mapping.items()})
        object.__setattr__(self, _PACKED_MODULES, table)  # beside the fields, so frozen subclasses work

    @property
    def packed_modules(self) -> Mapping[str, tuple[str, ...]]:
        """The fused-module table set by :meth:`set_packed_modules` (empty until then)."""
        table: Mapping[str, tuple[str, ...]] = self.__dict__.get(_PACKED_MODULES, types.MappingProxyType({}))
        return table

    def ignores(self, prefix: str) -> bool:
        """Whether this config's own skip list names the module ``prefix`` (default: nothing is skipped).

        Plugins override this with their list (bitsandbytes' ``llm_int8_skip_modules``,
        an ``ignore`` list); ``prefix`` is a dotted module name, either a layer of
        the model or, for a fused layer, the checkpoint name of one of its parts.
        """
        return False

    def skip(self, prefix: str) -> bool:
        """Whether the layer at ``prefix`` stays unquantized.

        True when :meth:`ignores` names it; for a fused layer (its last name
        component is in :attr:`packed_modules`) also when it names every part
        by its checkpoint name (``...self_attn.q_proj`` for ``...self_attn.qkv_proj``).
        Naming only some parts cannot be honoured, since the parts share one
        weight, and raises :class:`~loader.errors.FusedLayerSkipError`.
        """
        if self.ignores(prefix):
            return True
        parent, _, leaf = prefix.rpartition(".")
        parts = self.packed_modules.get(leaf)
        if not parts:
            return False
        names = [f"{parent}.{part}" if parent else part for part in parts]
        skipped = [name for name in names if self.ignores(name)]
        if skipped and len(skipped) < len(names):
            kept = [name for name in names if name not in skipped]
            raise FusedLayerSkipError(
                f"{self.name or type(self).__name__} keeps {skipped} unquantized but quantizes {kept}, and "
                f"{prefix} fuses them into one weight; skip all of its parts or none"
            )
        return bool(skipped)

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        """Adapt the checkpoint stream before the model's ``load_weights`` sees it (default: unchanged).

        A pre-quantized format whose weights come as several tensors (packed data
        plus scales) can bundle them into one tensor per weight here, so model
        plugins route it like a dense weight and need no quantization-specific names.
        """
        return weights


_State = TypeVar("_State")


class QuantizeMethodBase(abc.ABC):
    """How one layer's parameters are created, used and finished."""

    #: the layer attribute holding this method's own record of the layer (see :meth:`set_layer_state`).
    layer_state_attr: ClassVar[str] = "quant_state"

    #: ``True`` lets the core run :meth:`process_weights_after_loading` on a worker thread, beside other layers',
    #: on a CPU load. Set it when the step touches only its own layer and state safe to share between threads
    #: (a lock around caches, dict assignments), and spends its time where the GIL is released (torch ops,
    #: :mod:`ctypes` calls): the threads then repack and fault in fresh pages side by side. The task sees the
    #: loading thread's context (its load session) and grad mode, its torch ops on one intra-op thread (the
    #: workers already fill the CPUs); default ``False``, one layer at a time.
    process_weights_concurrently: ClassVar[bool] = False

    def set_layer_state(self, layer: nn.Module, state: object) -> None:
        """Keep ``state`` (this method's typed record of ``layer``: sizes, parts seen, kernel) on the layer.

        A method that needs more than its parameters between ``create_weights``,
        loading and ``apply`` stores it here rather than in untyped attributes.
        """
        setattr(layer, self.layer_state_attr, state)

    def layer_state(self, layer: nn.Module, kind: type[_State]) -> _State:
        """The record :meth:`set_layer_state` kept; ``TypeError`` if this method did not set ``layer`` up."""
        state = getattr(layer, self.layer_state_attr, None)
        if not isinstance(state, kind):
            raise TypeError(f"{type(layer).__name__} was not set up by {type(self).__name__}.create_weights")
        return state

    @abc.abstractmethod
    def create_weights(self, layer: nn.Module, *args: Any, **kwargs: Any) -> None:
        """Register the layer's parameters (on whatever device is current), sized by the layer's one shape
        record (:class:`LinearShape`, :class:`EmbeddingShape`)."""

    @abc.abstractmethod
    def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the layer's math with these parameters."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """Finish the layout after loading (repack, permute); default: nothing."""

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """Why ``loader.update_weights`` cannot write new tensors into ``layer``; ``None`` when the weight loaders
        write in place and a second :meth:`process_weights_after_loading` (run on each layer written) keeps every
        parameter's storage. Default: refused, as a method that does not say it can."""
        return f"its quantize method {type(self).__name__} does not take new weights in place"

    def open_for_update(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """An update is about to write into ``layer``: give it parameters for the checkpoint's tensors again.

        A method whose :meth:`process_weights_after_loading` replaced the checkpoint-layout parameters by
        buffers of its own (a repack into a kernel's layout) registers fresh ones here, named and sharded as
        at :meth:`create_weights`, so the model's ``load_weights`` lands the new tensors in them; the second
        :meth:`process_weights_after_loading` then converts them and copies the result into the existing
        buffers. Called once per update before the first tensor (and again after a probe pass, which must
        forget the parts it recorded); default: nothing, the parameters are still there.
        """

    def check_update(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """Raise a :class:`~loader.errors.LoadError` naming what is missing when the tensors an update gave
        ``layer`` cannot be converted on their own (a packed layer needs its whole tensor set). Asked of every
        layer written before any is post-processed, and after a probe; default: any subset will do."""

    def close_update(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """The update is over, written or not: drop whatever :meth:`open_for_update` added that the second
        :meth:`process_weights_after_loading` did not consume (default: nothing)."""

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """What this layer would run with, decided from its shapes and the config alone, or ``None`` when only
        its weights can tell.

        ``loader inspect --layers`` builds the model on the ``meta`` device and
        calls this for every layer, so it must read no tensor data. The
        :class:`~loader.kernels.KernelChoice` is the one the method records
        for the layer at load — ``kernel``, ``reason`` (why it is not the
        preferred kernel, or ``None``) and what it runs from — so the CLI
        shows plans and load results the same way (default: ``None``).
        """
        return None


class LinearMethodBase(QuantizeMethodBase):
    """Quantize method for the parallel linear layers."""

    @abc.abstractmethod
    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        """Register this rank's parameters on ``layer``, sized by ``shape`` (see :class:`LinearShape`).

        Put ``shape.weight_loader`` in each parameter's
        :class:`~loader.layers.param_layout.ParamLayout` (or wrap it) so the
        layer splits fused tensors, checks shapes and narrows rows to this rank.
        """

    @abc.abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Compute ``x @ W.T + bias`` for this rank's shard."""


class EmbeddingMethodBase(QuantizeMethodBase):
    """Quantize method for the vocabulary embedding (vLLM's ``GGUFEmbeddingMethod`` shape).

    The embedding keeps its vocabulary-row split over ranks; the method owns
    how this rank's rows are stored (blocks as the file has them) and turns
    looked-up rows into floats. A head tied to the embedding multiplies with
    the same storage through :meth:`apply`, so the table is held once.
    """

    @abc.abstractmethod
    def create_weights(self, layer: nn.Module, shape: EmbeddingShape) -> None:
        """Register this rank's parameters on ``layer``: ``shape.rows_per_partition`` padded vocabulary rows.

        ``shape.weight_loader`` is the layer's: it checks the checkpoint
        tensor's shape, narrows it to this rank's rows and, when the
        parameter's layout has a ``load_part``, hands the narrowed rows there
        instead of copying.
        """

    @abc.abstractmethod
    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` (indices into this rank's shard, all in range) as ``[*ids.shape, embedding_dim]``."""

    @abc.abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` over this rank's rows: the logits of a head tied to this embedding."""

    def tie_head(self, layer: nn.Module) -> None:
        """A head will multiply with ``layer``'s storage (called before loading; default: nothing).

        A method whose lookup storage has no fast matmul decides here or at
        :meth:`process_weights_after_loading` what the head runs with.
        """


class UnquantizedLinearMethod(LinearMethodBase):
    """Plain dense weights: one ``weight`` parameter ``(sum(output parts), input)``."""

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        import torch

        weight = torch.nn.Parameter(
            torch.empty(shape.output_size_per_partition, shape.input_size_per_partition, dtype=shape.params_dtype),
            requires_grad=False,
        )
        set_param_layout(weight, ParamLayout(weight_loader=shape.weight_loader, output_dim=0, input_dim=1))
        layer.register_parameter("weight", weight)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """A dense layer: the checkpoint (or the quantization's skip list) keeps it unquantized."""
        return KernelChoice("dense")

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """Dense weights are plain copies: an update writes them in place."""
        return None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from typing import cast

        import torch
        import torch.nn.functional as F

        return F.linear(x, cast(torch.Tensor, layer.weight), bias)


def method_name_of(quant_config: QuantizationConfig | None) -> str:
    """How messages name the quantization (``"none"`` without one)."""
    return (quant_config.name or type(quant_config).__name__) if quant_config is not None else "none"


def quant_method_asked(quant_config: QuantizationConfig | None, layer: nn.Module,
                       prefix: str) -> QuantizeMethodBase | None:
    """The config's answer for ``layer`` (``None``: none, or skipped); its bugs are a named ``PluginError``."""
    if quant_config is None or quant_config.skip(prefix):
        return None
    try:
        return quant_config.get_quant_method(layer, prefix)
    except LoadError:
        raise
    except Exception as exc:
        raise PluginError(f"quantization {method_name_of(quant_config)!r} failed in get_quant_method: "
                          f"{type(exc).__name__}: {exc}") from exc


def linear_method_for(
    quant_config: QuantizationConfig | None, layer: nn.Module, prefix: str
) -> LinearMethodBase:
    """The config's method for this layer, unquantized when there is no config or it skips the layer.

    A config's own bug (an exception that is not a :class:`~loader.errors.LoadError`,
    or a method that is not a linear one) becomes a :class:`~loader.errors.PluginError`
    naming the quantization, not the model being built.
    """
    method = quant_method_asked(quant_config, layer, prefix)
    if method is None:
        return UnquantizedLinearMethod()
    method_name = method_name_of(quant_config)
    if not isinstance(method, LinearMethodBase):
        raise PluginError(
            f"quantization {method_name!r} gave {type(method).__name__} for the linear layer {prefix!r}; "
            "a linear layer needs a LinearMethodBase"
        )
    return method


def embedding_method_for(
    quant_config: QuantizationConfig | None, layer: nn.Module, prefix: str
) -> EmbeddingMethodBase | None:
    """The config's method for a vocabulary embedding, ``None`` to keep it dense.

    Dense when there is no config, it skips the layer, or it answers ``None``
    or a :class:`LinearMethodBase` — configs written before embeddings asked
    (answering every layer with their linear method) keep a dense table, as
    they did. Any other answer is a plugin bug, reported as a
    :class:`~loader.errors.PluginError` naming the quantization.
    """
    method = quant_method_asked(quant_config, layer, prefix)
    if method is None or isinstance(method, LinearMethodBase):
        return None
    method_name = method_name_of(quant_config)
    if not isinstance(method, EmbeddingMethodBase):
        raise PluginError(
            f"quantization {method_name!r} gave {type(method).__name__} for the embedding {prefix!r}; "
            "an embedding needs an EmbeddingMethodBase"
        )
    return method
