"""Step 4 of the pipeline: let each quantized layer finish its layout.

Registered as plugin ``core.postprocess``. For each module carrying a
``quant_method``, its parameters are moved to the target device for the call
and copied back where they lived afterwards (the seed's
``device_loading_context``), so a repack that needs the GPU works even for
layers kept on the CPU.

The heap is trimmed as layers are processed (:func:`~loader._pipeline.heap.release_freed_heap`):
a layer's temporaries are freed between the buffers the next layers
allocate, and glibc keeps such fragments resident until trimmed, so without
it they add up across layers and the load's peak RSS (measured: 50 MiB on a
1 GB GPTQ Llama, 8 layers) stands above what is live. A trim walks the whole
heap (~0.3 ms), so it runs once :data:`TRIM_AFTER_BYTES` of processed layers'
tensors have been built since the last one, not after every layer: SmolLM2's
121 small GGUF layers trimmed each time spent 20-50 ms of a 0.3-s load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl
from .heap import release_freed_heap

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..layers.quantization import QuantizationConfig

__all__ = ["TRIM_AFTER_BYTES", "device_loading_context", "loader_process_weights_after_loading"]

TRIM_AFTER_BYTES = 4 << 20
"""Processed layers' tensor bytes between two heap trims: a 1.1B GPTQ Llama's MLP layers (6-12 MiB packed)
are each still followed by their own trim, and its last, the quantized head whose conversion sets the
load's peak, too; a 135M GGUF model's layers (0.2-0.9 MiB each) share one per ~8 layers."""


@contextmanager
def device_loading_context(module: nn.Module, target_device: torch.device) -> Iterator[nn.Module]:
    """Temporarily move ``module``'s CPU parameters to ``target_device``."""
    import torch

    if target_device.type == "cpu":
        yield module
        return
    moved: dict[str, torch.device] = {}
    for name, param in module.named_parameters(recurse=False):
        if param.device.type == "cpu":
            moved[name] = param.device
            param.data = param.data.to(target_device)
    try:
        yield module
    finally:
        pin = torch.cuda.is_available()
        for name, param in module.named_parameters(recurse=False):
            if name in moved:
                back = torch.empty_like(param.data, device="cpu", pin_memory=pin)
                back.copy_(param.data)
                param.data = back


@hookimpl(trylast=True)
def loader_process_weights_after_loading(
    model: nn.Module, quant_config: QuantizationConfig | None, target_device: torch.device
) -> None:
    from ..layers.quantization import QuantizeMethodBase
    from .materialize import parameter_bytes

    since_trim = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            with device_loading_context(module, target_device):
                method.process_weights_after_loading(module)
            since_trim += parameter_bytes(module)
            if since_trim >= TRIM_AFTER_BYTES:
                release_freed_heap()
                since_trim = 0
    release_freed_heap()
