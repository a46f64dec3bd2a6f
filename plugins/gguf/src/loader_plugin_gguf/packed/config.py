"""The quantization config of a packed GGUF load: what the load asked for, each layer's method, and the record of
what every layer chose (the load report's ``quantization``).

It also holds what the load's layers share: the files' header tensors (a plan maps them to layers as a load
does) and the load's packed-weights bundle (:class:`loader.kernels.LoadBundle`: made on first use, let go once
it is written).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from loader.kernels import KernelChoice, LoadBundle, native_repack, native_repack_unavailable_reason
from loader.layers import FusedMoE, LinearBase, ParallelLMHead, QuantizationConfig, VocabParallelEmbedding
from loader.weights import CheckpointTensor, ReadStats

from ..format.header import read_header
from ..format.weight_stream import iter_gguf_weights
from .bundle_keys import cache_requested, open_load_bundle
from .embedding import GGUFEmbeddingMethod, GGUFHeadMethod
from .embedding_store import HEAD_KERNEL_TYPES
from .experts_method import GGUFExpertsMethod
from .linear_method import GGUFLinearMethod
from .options import METHOD_NAME, dtype_name, kernel_dtype_for, kernel_dtype_requested, packing_requested

if TYPE_CHECKING:
    from torch import nn

    from loader.checkpoint import LoadOptions
    from loader.layers import QuantizeMethodBase

__all__ = ["GGUFQuantConfig", "config_for_load", "finish_load"]

@attrs.define
class GGUFQuantConfig(QuantizationConfig):
    """The user's request to keep GGUF blocks packed; records each layer's choice for the load report."""

    name = METHOD_NAME
    kernel_dtype: torch.dtype | None = None
    """The dtype the int4 kernel computes in; ``None``: :func:`~.options.kernel_dtype_for` the layer's dtype."""
    dense_dtype: torch.dtype | None = None
    """The dtype a layer of quantized blocks that cannot stay packed is dequantized to (``None``: the layer's
    own). A ``dtype="auto"`` load sets the kernel's: Q6_K/Q8_0 layers of a Q4_K_M file then take 2 bytes a
    value, not float32's 4 (float tensors keep the layer's dtype)."""
    head_type: int | None = None
    """The ggml type of the file's own ``output.weight`` (``None``: the head is tied to the embedding). A type
    with a head kernel is kept by :class:`~.embedding.GGUFHeadMethod`."""
    layer_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False)
    files: tuple[str, ...] = attrs.field(default=(), eq=False)
    """The load's GGUF files, whose headers ``layer_plan`` plans from (empty: layers are decided at load)."""
    bundle: LoadBundle | None = attrs.field(default=None, eq=False, repr=False)
    """The load's packed-weights bundle for :attr:`files` (``None``: packed layers are not looked up or kept on
    disk; :mod:`~.bundle_keys`)."""
    _header_tensors: dict[str, CheckpointTensor] | None = attrs.field(default=None, init=False, eq=False,
                                                                      repr=False)

    def cached_unit(self, key: str | None, build: Callable[[], dict[str, torch.Tensor] | None],
                    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> dict[str, torch.Tensor] | None:
        """The unit ``key`` from the bundle, else ``build()``'s tensors, stored for the bundle (``build`` returns
        ``None`` for a result the bundle cannot hold; ``key`` ``None``: never cached). A stored unit whose
        tensors are not ``expected`` (name -> dtype, shape) is packed again."""
        cache = self.bundle.open() if key is not None and self.bundle is not None else None
        if cache is None or key is None:
            return build()
        return cache.cached(key, build, expected)

    def header_tensors(self) -> dict[str, CheckpointTensor]:
        """Every tensor of :attr:`files` under the name a load gives it, read from the headers only (cached).

        The load's own stream (:func:`~loader_plugin_gguf.format.weight_stream.iter_gguf_weights`) names them,
        so a plan maps GGUF tensors to layers exactly as a load does, q/k rotary reordering included.
        """
        if self._header_tensors is None:
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
            "packed_cache": None if self.bundle is None else self.bundle.describe(),
        }

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~.linear_method.GGUFLinearMethod` for every parallel linear layer,
        :class:`~.embedding.GGUFEmbeddingMethod` for the token embedding and
        :class:`~.embedding.GGUFHeadMethod` for an untied output head, :class:`~.experts_method.GGUFExpertsMethod`
        for a mixture-of-experts layer's experts."""
        if isinstance(layer, FusedMoE):
            return GGUFExpertsMethod(self)
        if isinstance(layer, LinearBase):
            return GGUFLinearMethod(self)
        if isinstance(layer, ParallelLMHead):
            # tied (no output.weight): the embedding keeps the table; a float head stays dense (and mapped)
            return GGUFHeadMethod(self) if self.head_type in HEAD_KERNEL_TYPES else None
        if isinstance(layer, VocabParallelEmbedding):
            return GGUFEmbeddingMethod(self)
        return None


def _packing(kernels: dict[str, int]) -> str | None:
    """What packed this load's int4 layers: ``compiled`` (:func:`loader.kernels.native_repack`'s helpers, for
    Q4_0/Q4_1 codes and Q8_0 planes; ``compiled: <note>`` when their cached library had to be built again)
    or ``torch: <why not>``; ``None`` when no layer is on the int4 kernel."""
    if not any("int4" in kernel for kernel in kernels):
        return None
    helpers = native_repack()
    if helpers is not None:
        return "compiled" if helpers.note is None else f"compiled: {helpers.note}"
    return f"torch: {native_repack_unavailable_reason()}"


def config_for_load(requested: str | None, options: LoadOptions, files: tuple[str, ...]) -> GGUFQuantConfig | None:
    """The config of a GGUF load that keeps its blocks packed (``requested`` ``gguf``, or no quantization named
    and :func:`~.options.packing_requested`), ``None`` when it dequantizes; the options are checked first
    (:func:`~.bundle_keys.cache_requested`), whichever it is. ``files``: the load's GGUF files, whose headers
    each layer plans from."""
    kernel_dtype = kernel_dtype_requested(options) or kernel_dtype_for(options.dtype)
    use_cache = cache_requested(options)
    if requested != "gguf" and not packing_requested(options):
        return None
    # dtype auto: what cannot stay packed is dequantized to the kernel's dtype, not float32
    dense_dtype = kernel_dtype if options.dtype_auto else None
    bundle = None
    if use_cache and files:
        bundle = LoadBundle(functools.partial(open_load_bundle, files, dtype_name(kernel_dtype),
                                              None if dense_dtype is None else dtype_name(dense_dtype)))
    return GGUFQuantConfig(kernel_dtype=kernel_dtype, dense_dtype=dense_dtype, files=files,
                           head_type=_output_head_type(files), bundle=bundle)


def finish_load(quant_config: QuantizationConfig) -> None:
    """After every layer of a load succeeded: write the packed-weights bundle of a packed GGUF load."""
    if isinstance(quant_config, GGUFQuantConfig) and quant_config.bundle is not None:
        quant_config.bundle.finish()


def _output_head_type(files: tuple[str, ...]) -> int | None:
    """The ggml type of ``output.weight`` in any of the load's files (headers are cached), ``None`` if absent."""
    for file in files:
        for info in read_header(Path(file)).tensors:
            if info.name == "output.weight":
                return int(info.ggml_type)
    return None
