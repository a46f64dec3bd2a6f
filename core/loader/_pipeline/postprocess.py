"""Step 4 of the pipeline: let each quantized layer finish its layout.

Registered as plugin ``core.postprocess``. For each module carrying a
``quant_method``, its parameters are moved to the target device for the call
and copied back where they lived afterwards (vLLM's
``device_loading_context``), so a repack that needs the GPU works even for
layers kept on the CPU.

The heap is trimmed as layers are processed (:func:`~loader._heap.release_freed_heap`):
a layer's temporaries are freed between the buffers the next layers
allocate, and glibc keeps such fragments resident until trimmed, so without
it they add up across layers and the load's peak RSS stands above what is
live. A trim walks the whole heap, so it runs once :data:`TRIM_AFTER_BYTES`
of processed layers' tensors have been built since the last one, not after
every layer: a model of many small layers would spend a share of its load
trimming (benchmarks/RESULTS.md).

On a CPU load, layers whose method sets
:attr:`~loader.layers.QuantizeMethodBase.process_weights_concurrently` are
processed on worker threads (as many as :mod:`loader._io_pool` reads with,
``LOADER_READ_THREADS``), started for the step and ended with it, while the
others run on the loading thread in model order: a
repack's heavy steps (torch ops, compiled helpers called through
:mod:`ctypes`) release the GIL, and much of their time is the kernel faulting
in the fresh pages they write, which two threads do side by side. Each task runs in a
copy of the loading thread's context (the load session) and grad mode, its
torch ops on one intra-op thread. A
failure cancels what has not started, waits for what has, and is raised for
the first failing layer in model order, so no layer is still being written
once the load has failed.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._heap import release_freed_heap
from .._io_pool import io_threads
from ..hookspecs import hookimpl
from ..layers.quantization import QuantizeMethodBase

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..layers.quantization import QuantizationConfig, QuantizeMethodBase

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

    layers = [(module, method) for module in model.modules()
              if isinstance(method := getattr(module, "quant_method", None), QuantizeMethodBase)]
    willing = [(module, method) for module, method in layers if method.process_weights_concurrently]
    threads = min(io_threads(), len(willing)) if target_device.type == "cpu" else 1
    if threads < 2:
        _process(layers, {}, target_device)
        return
    # threads of its own, ended with the step: a thread that ran torch ops keeps an OpenMP team, and while
    # such idle teams outnumber the CPUs libgomp stops spinning at barriers (a later decode runs several times slower).
    # Each runs torch ops on one thread: the workers already fill the CPUs, and a team per worker
    # oversubscribed them.
    import torch

    intra_op = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="loader-postprocess",
                                initializer=torch.set_num_threads, initargs=(1,)) as pool:
            started = _start(pool, willing)
            try:
                _process(layers, started, target_device)
            except BaseException:
                _stop(started.values())
                raise
    finally:
        torch.set_num_threads(intra_op)  # the count a thread started later inherits (set_num_threads is global)


def _process(layers: list[tuple[nn.Module, QuantizeMethodBase]], started: dict[int, Future[None]],
             target_device: torch.device) -> None:
    """Each layer in model order: processed here, or its started task awaited; the heap trimmed as they end."""
    since_trim = 0
    for module, method in layers:
        running = started.get(id(module))
        if running is not None:
            running.result()
        else:
            with device_loading_context(module, target_device):
                method.process_weights_after_loading(module)
        since_trim += _own_bytes(module)
        if since_trim >= TRIM_AFTER_BYTES:
            release_freed_heap()
            since_trim = 0
    release_freed_heap()


def _own_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s own parameters and buffers: not its children's, which a worker may still be
    writing (and which, quantized themselves, are counted when their turn comes)."""
    tensors = {id(t): t for t in (*module._parameters.values(), *module._buffers.values()) if t is not None}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _start(pool: ThreadPoolExecutor, willing: list[tuple[nn.Module, QuantizeMethodBase]]) -> dict[int, Future[None]]:
    """Submit each layer's step to ``pool``, in the loading thread's context and grad mode."""
    import torch

    grad = torch.is_grad_enabled()

    def process(module: nn.Module, method: QuantizeMethodBase) -> None:
        with torch.set_grad_enabled(grad):
            method.process_weights_after_loading(module)

    return {id(module): pool.submit(contextvars.copy_context().run, process, module, method)
            for module, method in willing}


def _stop(futures: Iterable[Future[None]]) -> None:
    """Cancel the tasks not started and wait for the running ones: nothing writes to the model afterwards."""
    running = [future for future in futures if not future.cancel()]
    wait(running)
