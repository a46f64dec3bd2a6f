"""The bitsandbytes quantize method of the parallel linear layers.

Each quantized layer holds, for this rank's shard:

* ``weight`` — the packed 4-bit codes, a ``uint8`` parameter of shape
  ``(ceil(rows * cols / 2), 1)`` as bitsandbytes lays them out;
* buffers ``weight_absmax`` (float32 per block, or ``uint8`` codes once
  double-quantized), ``weight_quant_map`` (the 16-entry code table) and, with
  double quantization, ``weight_nested_absmax`` (every checkpoint module's
  nested scales, one module after another) / ``weight_nested_quant_map``
  (see :mod:`loader_plugin_bnb.nesting`).

Loading goes through the layer's own ``weight_loader`` (fused tensors split,
shapes checked, rows narrowed to this rank over the logical ``(rows, cols)``
the weight's :class:`~loader.layers.ParamLayout` declares); the
layout's ``load_part`` then lands each narrowed part: a dense checkpoint
tensor is read (only this rank's slice) and quantized, a
:class:`~loader_plugin_bnb.packed_tensor.Packed4bitTensor` (pre-quantized,
narrowed by whole blocks) has its codes copied, never re-quantized. Only ``weight`` is a
parameter, so the model's ``load_weights`` and the pipeline's "every parameter
filled" check see one name per layer, as for a dense model.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.layers import LinearMethodBase, LinearShape, ParamLayout, set_param_layout

from .codec import code_table, dequantize_blocks, quantize_blocks
from .layer_codes import LayerCodes, ShardId, tensor_of
from .nesting import NestedPart, assemble, dequantize_layer, module_blocks, nest_part
from .packed_tensor import BlockAlignmentError, Packed4bitTensor

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import LinearBase, NarrowedPart
    from loader.weights import CheckpointTensor

    from .config import BitsAndBytesConfig

__all__ = ["DUMMY_ABSMAX", "BitsAndBytesLinearMethod"]

DUMMY_ABSMAX = 1e-3
"""Block scale of layers filled by ``load_format="dummy"`` (the magnitude of its dense dummy weights)."""


def _shard_ids(layer: nn.Module) -> list[ShardId]:
    """The parts of a fused layer, in order (the layer's own list)."""
    return list(cast("LinearBase", layer).shard_ids())


class BitsAndBytesLinearMethod(LinearMethodBase):
    """NF4/FP4 weights for one linear layer: created, loaded, finished and multiplied."""

    layer_state_attr = "bnb_codes"

    def __init__(self, config: BitsAndBytesConfig) -> None:
        self.config = config

    # -- parameters --------------------------------------------------------------------------------

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        rows, cols = shape.output_size_per_partition, shape.input_size_per_partition
        codes = LayerCodes(
            prefix=str(getattr(layer, "prefix", "") or type(layer).__name__), rows=rows, cols=cols,
            part_rows=list(shape.output_partition_sizes), blocksize=self.config.blocksize,
            quant_type=self.config.quant_type, weight_dtype=shape.params_dtype,
            prequantized=self.config.prequantized,
        )
        packed = torch.empty((rows * cols + 1) // 2, 1, dtype=torch.uint8)
        weight = torch.nn.Parameter(packed, requires_grad=False)
        linear = cast("LinearBase", layer)
        # The layer's own loader splits fused tensors, checks shapes and narrows to this rank along the
        # logical (rows, cols); only the landing of each narrowed part (quantize or copy codes) is ours.
        set_param_layout(weight, ParamLayout(
            weight_loader=functools.partial(self.load_weight, linear), output_dim=0, input_dim=1,
            logical_shape=(rows, cols), load_part=functools.partial(self._load_part, linear),
        ))
        layer.register_parameter("weight", weight)
        layer.register_buffer("weight_absmax", torch.empty(codes.blocks, dtype=torch.float32))
        layer.register_buffer("weight_quant_map", torch.empty(16, dtype=torch.float32))
        self.set_layer_state(layer, codes)

    # -- loading -----------------------------------------------------------------------------------

    def load_weight(self, layer: LinearBase, param: torch.Tensor, loaded: CheckpointTensor,
                    shard_id: ShardId = None) -> None:
        """Land ``loaded`` (part ``shard_id``, or every part of a pre-fused tensor) through the layer's loader.

        Adds what only bitsandbytes knows to the layer's errors: a dense
        tensor where a packed one belongs, and a TP split that would cut a
        quantization block.
        """
        codes = self.layer_state(layer, LayerCodes)
        if codes.prequantized and not isinstance(loaded, Packed4bitTensor):
            raise CheckpointFormatError(
                f"{loaded.describe()}: {codes.prefix} expects a bitsandbytes 4-bit weight (packed uint8 "
                f"with absmax and quant_state) in this pre-quantized checkpoint, found "
                f"{str(loaded.dtype).removeprefix('torch.')} of shape {loaded.shape}"
            )
        try:
            layer.weight_loader(param, loaded, shard_id)
        except BlockAlignmentError as exc:
            assert isinstance(loaded, Packed4bitTensor)
            header = loaded.header
            raise UnsupportedError(
                f"{loaded.describe()}: cannot split the pre-quantized weight of shape {header.shape} "
                f"(blocksize {header.blocksize}) over tensor parallel size {layer.tp_size} for {codes.prefix}: "
                f"each rank's slice must be whole blocks. {exc}"
            ) from exc

    def _load_part(self, layer: LinearBase, param: torch.Tensor, part: NarrowedPart) -> None:
        """This rank's rows of one part, already narrowed by the layer: quantize them, or copy their codes."""
        codes = self.layer_state(layer, LayerCodes)
        narrowed = part.narrowed
        if isinstance(narrowed, Packed4bitTensor):
            header = narrowed.header
            codes.adopt_header(layer, header.blocksize, header.quant_type, header.torch_dtype, narrowed.describe())
            packed, absmax = narrowed.read_codes()
            codes.place_codes(layer, part.offset, part.size, packed, absmax, narrowed.describe())
        else:
            own = codes.place_dense(layer, part.shard_id, part.offset, narrowed.read(codes.weight_dtype))
            if own is not None and self.config.double_quant:
                codes.nested_parts.append(self._nest(codes, part, own))
        codes.mark_loaded(part.shard_id)

    def _nest(self, codes: LayerCodes, part: NarrowedPart, absmax: torch.Tensor) -> NestedPart:
        """Double-quantize one part's block scales over its whole checkpoint module, as ``transformers`` does.

        A rank holding only a slice of the module reads the module whole once
        more to get its statistics; a slice that is not whole blocks of the
        module (which then quantizes differently anyway) is nested on its own.
        """
        first_block = part.offset * codes.cols // codes.blocksize
        whole = part.whole
        placement = module_blocks(whole.shape, part.rows, part.cols, codes.blocksize) if whole.ndim == 2 else None
        if placement is None:
            count = absmax.numel()
            return nest_part(absmax, first_block, (0, count, count, count))
        if placement[3] == -(-whole.numel() // codes.blocksize):  # this rank holds the whole module
            return nest_part(absmax, first_block, placement)
        dense = whole.read(codes.weight_dtype).to(absmax.device)
        return nest_part(quantize_blocks(dense, codes.blocksize, codes.quant_type)[1], first_block, placement)

    # -- after loading -----------------------------------------------------------------------------

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Check every part arrived, write the code table, double-quantize ``absmax`` if asked.

        A layer none of whose parts went through the weight loader had its
        packed bytes filled directly (``load_format="dummy"``): its scales are
        set to a small constant so the random codes give small random weights.
        """
        codes = self.layer_state(layer, LayerCodes)
        if codes.finished:
            return
        if not codes.loaded:
            tensor_of(layer, "weight_absmax").fill_(DUMMY_ABSMAX)
        else:
            shard_ids: list[ShardId] = _shard_ids(layer) if len(codes.part_rows) > 1 else [None]
            codes.check_complete(shard_ids)
        quant_map = tensor_of(layer, "weight_quant_map")
        quant_map.copy_(code_table(codes.quant_type, quant_map.device))
        if self.config.double_quant and not codes.prequantized:
            parts = codes.nested_parts or [nest_part(tensor_of(layer, "weight_absmax"), 0,
                                                     (0, codes.blocks, codes.blocks, codes.blocks))]
            nested = assemble(parts, codes.blocks)
            layer.weight_absmax = nested.codes
            layer.register_buffer("weight_nested_absmax", nested.scales)
            layer.register_buffer("weight_nested_quant_map", nested.code)
            codes.nested, codes.nested_parts = nested.ranges, []
        codes.finished = True

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """New float weights are quantized in place as at load (same blocks, codes and ``absmax``), and the
        finished layer needs no step after; double-quantized scales are nested once, at load, and cannot be."""
        if self.config.double_quant:
            return ("its bitsandbytes block scales are double-quantized (double_quant), which is done once at load; "
                    "load without double_quant to update it")
        return None

    # -- forward -----------------------------------------------------------------------------------

    def float_absmax(self, layer: nn.Module) -> torch.Tensor:
        """The per-block float32 ``absmax`` (dequantized, module by module, when double-quantized)."""
        codes = self.layer_state(layer, LayerCodes)
        if codes.nested is None:
            return tensor_of(layer, "weight_absmax")
        return dequantize_layer(tensor_of(layer, "weight_absmax"), tensor_of(layer, "weight_nested_absmax"),
                                tensor_of(layer, "weight_nested_quant_map"), codes.nested)

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        """This rank's weight ``(rows, cols)`` in the dtype it was quantized from."""
        codes = self.layer_state(layer, LayerCodes)
        return dequantize_blocks(tensor_of(layer, "weight"), self.float_absmax(layer),
                                 tensor_of(layer, "weight_quant_map"),
                                 (codes.rows, codes.cols), codes.blocksize, codes.weight_dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        compute = self.config.torch_compute_dtype or x.dtype
        xc = x.to(compute)
        bc = None if bias is None else bias.to(compute)
        if x.device.type == "cuda":
            from bitsandbytes import matmul_4bit

            out = matmul_4bit(xc, tensor_of(layer, "weight").t(), self.bnb_quant_state(layer), bias=bc)
        else:
            out = torch.nn.functional.linear(xc, self.dequantized_weight(layer).to(compute), bc)
        return out.to(x.dtype)

    def bnb_quant_state(self, layer: nn.Module) -> Any:
        """A ``bitsandbytes.functional.QuantState`` over the layer's buffers (for its CUDA kernels).

        A double-quantized layer nests each checkpoint module on its own, which
        one ``QuantState`` cannot express; it is handed the float32 ``absmax``
        those codes stand for, which is what bitsandbytes computes first anyway.
        """
        from bitsandbytes.functional import QuantState

        codes = self.layer_state(layer, LayerCodes)
        return QuantState(
            absmax=self.float_absmax(layer), shape=torch.Size((codes.rows, codes.cols)),
            code=tensor_of(layer, "weight_quant_map"),
            blocksize=codes.blocksize, quant_type=codes.quant_type, dtype=codes.weight_dtype,
        )
