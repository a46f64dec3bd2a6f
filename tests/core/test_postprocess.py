"""The post-loading device context (the seed's ``device_loading_context``): parameters visit the target device.

A quantize method's ``process_weights_after_loading`` may need the GPU (a
repack) even for a layer whose parameters live on the CPU. On a machine
without CUDA the move itself is faked (``Tensor.to`` a fake GPU returns a CPU
copy noted as resident there; the ``meta`` device cannot stand in, torch
refuses to swap a CPU parameter's data for a meta tensor), which tests which
parameters move, what comes back and when. The CUDA tests run the real move
and check that the copy back lands in pinned memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from loader._pipeline.postprocess import device_loading_context

FAKE_GPU = torch.device("cuda", 7)  # never used as a device: the fixture intercepts moves to it
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Layer(nn.Module):
    """Two parameters of its own and a child whose parameters the context must leave alone."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3), requires_grad=False)
        self.scale = nn.Parameter(torch.ones(2), requires_grad=False)
        self.child = nn.Linear(3, 2)


def _repacked() -> torch.Tensor:
    """What the tests' repack leaves: a new tensor of another shape, computed from the weight's values."""
    return (torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2).t().contiguous()


class FakeGpu:
    """The tensors moved "to the GPU", kept alive so no later allocation can reuse their addresses."""

    def __init__(self) -> None:
        self.copies: list[torch.Tensor] = []

    def __contains__(self, tensor: torch.Tensor) -> bool:
        return any(tensor.data_ptr() == copy.data_ptr() for copy in self.copies)


@pytest.fixture
def on_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """``Tensor.to(FAKE_GPU)`` returns a CPU copy that the returned :class:`FakeGpu` holds."""
    gpu = FakeGpu()
    real_to = torch.Tensor.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args[:1] == (FAKE_GPU,) or kwargs.get("device") == FAKE_GPU:
            gpu.copies.append(self.clone())
            return gpu.copies[-1]
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    yield gpu


def test_a_cpu_target_moves_nothing() -> None:
    layer = Layer()
    before = {name: p.data_ptr() for name, p in layer.named_parameters()}
    with device_loading_context(layer, torch.device("cpu")) as inside:
        assert inside is layer
        assert {name: p.data_ptr() for name, p in layer.named_parameters()} == before
    assert {name: p.data_ptr() for name, p in layer.named_parameters()} == before


def test_own_cpu_parameters_visit_the_target_and_come_back_with_what_the_block_left(on_fake_gpu: FakeGpu) -> None:
    layer = Layer()
    child_weight = layer.child.weight.data_ptr()
    with device_loading_context(layer, FAKE_GPU):
        assert layer.weight in on_fake_gpu and layer.scale in on_fake_gpu
        assert layer.child.weight.data_ptr() == child_weight, "only the module's own parameters move"
        torch.testing.assert_close(layer.weight.data, torch.arange(6, dtype=torch.float32).reshape(2, 3))
        layer.weight.data = (layer.weight.data * 2).t().contiguous()  # the repack, "on the GPU"
        repacked = layer.weight.data_ptr()
    assert layer.weight not in on_fake_gpu and layer.scale not in on_fake_gpu
    assert layer.weight.data_ptr() != repacked, "copied back into fresh CPU memory"
    assert layer.weight.device.type == "cpu" and layer.weight.shape == (3, 2)
    torch.testing.assert_close(layer.weight.data, _repacked())
    torch.testing.assert_close(layer.scale.data, torch.ones(2))
    assert isinstance(layer.weight, nn.Parameter) and not layer.weight.requires_grad
    assert layer.weight.is_pinned() == torch.cuda.is_available(), "pinned memory where CUDA is available"


def test_parameters_come_back_when_the_block_raises(on_fake_gpu: FakeGpu) -> None:
    layer = Layer()
    with pytest.raises(RuntimeError, match="repack failed"), device_loading_context(layer, FAKE_GPU):
        layer.scale.data = torch.full((2,), 3.0)
        raise RuntimeError("repack failed")
    assert layer.weight not in on_fake_gpu and layer.scale not in on_fake_gpu
    torch.testing.assert_close(layer.weight.data, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    torch.testing.assert_close(layer.scale.data, torch.full((2,), 3.0))


def test_a_parameter_added_by_the_block_stays_where_it_was_made(on_fake_gpu: FakeGpu) -> None:
    layer = Layer()
    with device_loading_context(layer, FAKE_GPU):
        made = torch.zeros(2).to(FAKE_GPU)
        layer.register_parameter("zeros", nn.Parameter(made, requires_grad=False))
    assert layer.zeros in on_fake_gpu
    assert layer.weight not in on_fake_gpu


# --- CUDA: the branch the seed wrote it for -------------------------------------------------


@needs_cuda
def test_cuda_repack_comes_back_to_pinned_cpu_memory() -> None:
    layer = Layer()
    target = torch.device("cuda", torch.cuda.current_device())
    with device_loading_context(layer, target):
        assert layer.weight.device.type == "cuda" and layer.scale.device.type == "cuda"
        assert layer.child.weight.device.type == "cpu"
        layer.weight.data = (layer.weight.data * 2).t().contiguous()  # the repack runs on the GPU
    for param in (layer.weight, layer.scale):
        assert param.device.type == "cpu"
        assert param.is_pinned(), "pinned, so the next transfer to the GPU is asynchronous"
    torch.testing.assert_close(layer.weight.data, _repacked())
    torch.testing.assert_close(layer.scale.data, torch.ones(2))


@needs_cuda
def test_cuda_parameters_already_on_the_gpu_stay_there() -> None:
    layer = Layer()
    target = torch.device("cuda", torch.cuda.current_device())
    layer.scale.data = layer.scale.data.to(target)
    scale = layer.scale.data_ptr()
    with device_loading_context(layer, target):
        assert layer.scale.data_ptr() == scale
    assert layer.scale.device.type == "cuda" and layer.scale.data_ptr() == scale
    assert layer.weight.device.type == "cpu"


@needs_cuda
def test_cuda_parameters_come_back_when_the_block_raises() -> None:
    layer = Layer()
    with pytest.raises(RuntimeError, match="repack failed"), \
            device_loading_context(layer, torch.device("cuda", torch.cuda.current_device())):
        raise RuntimeError("repack failed")
    assert layer.weight.device.type == "cpu" and layer.weight.is_pinned()
    torch.testing.assert_close(layer.weight.data, torch.arange(6, dtype=torch.float32).reshape(2, 3))


class _Packed(nn.Module):
    """A layer whose method leaves ``size`` bytes of buffers, as a repack would."""

    def __init__(self, size: int) -> None:
        super().__init__()
        from loader.layers.quantization import QuantizeMethodBase

        class Method(QuantizeMethodBase):
            def create_weights(self, layer: nn.Module, *args: Any, **kwargs: Any) -> None:
                return None

            def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
                raise NotImplementedError

            def process_weights_after_loading(self, layer: nn.Module) -> None:
                layer.register_buffer("packed", torch.empty(size, dtype=torch.uint8))

        self.quant_method = Method()


def test_the_heap_is_trimmed_per_trim_after_bytes_of_processed_layers_and_once_at_the_end(monkeypatch):
    """Small layers share a trim (each walks the whole heap), a big one gets its own, and the end always one."""
    from loader._pipeline import postprocess

    trims: list[int] = []
    processed: list[str] = []
    monkeypatch.setattr(postprocess, "release_freed_heap", lambda: trims.append(len(processed)))
    small, big = postprocess.TRIM_AFTER_BYTES // 4, postprocess.TRIM_AFTER_BYTES * 2
    model = nn.Sequential(*(_Packed(size) for size in [small] * 6 + [big] + [small]))
    for index, module in enumerate(model):
        real = module.quant_method.process_weights_after_loading

        def track(layer: nn.Module, real: Any = real, index: int = index) -> None:
            real(layer)
            processed.append(str(index))

        monkeypatch.setattr(module.quant_method, "process_weights_after_loading", track)
    postprocess.loader_process_weights_after_loading(model, None, torch.device("cpu"))
    assert processed == [str(i) for i in range(8)]
    assert trims == [4, 7, 8]  # after four quarters, after the big layer (and the two smalls before it), the end


class _Step(nn.Module):
    """A layer whose method runs ``step(layer)``, on a worker thread when ``concurrent``."""

    def __init__(self, step: Any, concurrent: bool = True) -> None:
        super().__init__()
        from loader.layers.quantization import QuantizeMethodBase

        class Method(QuantizeMethodBase):
            process_weights_concurrently = concurrent

            def create_weights(self, layer: nn.Module, *args: Any, **kwargs: Any) -> None:
                return None

            def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
                raise NotImplementedError

            def process_weights_after_loading(self, layer: nn.Module) -> None:
                step(layer)

        self.quant_method = Method()


def _postprocess(model: nn.Module, device: torch.device | None = None) -> None:
    from loader._pipeline import postprocess

    postprocess.loader_process_weights_after_loading(model, None, device or torch.device("cpu"))


def _live_workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("loader-postprocess")]


def test_willing_layers_are_processed_side_by_side_on_threads_that_end_with_the_step(monkeypatch):
    """Two layers that each wait for the other finish only if they run at once; the unwilling one stays here."""
    monkeypatch.setenv("LOADER_READ_THREADS", "2")
    meeting = threading.Barrier(2, timeout=30)
    seen: dict[str, str] = {}

    def meet(name: str) -> Any:
        def step(layer: nn.Module) -> None:
            seen[name] = threading.current_thread().name
            meeting.wait()
        return step

    model = nn.Sequential(_Step(meet("a")), _Step(lambda layer: seen.update(c=threading.current_thread().name),
                                                  concurrent=False), _Step(meet("b")))
    _postprocess(model)
    assert seen["a"].startswith("loader-postprocess") and seen["b"].startswith("loader-postprocess")
    assert seen["c"] == threading.current_thread().name
    assert _live_workers() == []  # an idle worker's OpenMP team would slow every later torch op


@pytest.mark.parametrize("reason", ["one thread", "not the CPU"])
def test_layers_stay_on_the_loading_thread_with_one_thread_or_off_the_cpu(monkeypatch, reason):
    monkeypatch.setenv("LOADER_READ_THREADS", "1" if reason == "one thread" else "2")
    names: list[str] = []
    model = nn.Sequential(*(_Step(lambda layer: names.append(threading.current_thread().name)) for _ in range(3)))
    _postprocess(model, torch.device("cpu") if reason == "one thread" else FAKE_GPU)  # no parameters move
    assert names == [threading.current_thread().name] * 3


def test_a_worker_sees_the_loading_thread_s_context_and_grad_mode(monkeypatch):
    """The load session lives in a context variable; post-processing runs under ``no_grad``."""
    import contextvars

    monkeypatch.setenv("LOADER_READ_THREADS", "2")
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    seen: list[tuple[str, bool]] = []
    model = nn.Sequential(*(_Step(lambda layer: seen.append((marker.get(), torch.is_grad_enabled())))
                            for _ in range(2)))
    marker.set("this load")
    with torch.no_grad():
        _postprocess(model)
    assert seen == [("this load", False)] * 2


def test_a_failing_layer_fails_the_step_and_nothing_runs_on_after_it(monkeypatch):
    """The error is the first failing layer's in model order; layers not started are cancelled, running ones
    finish before the step returns (no thread writes to the model of a failed load)."""
    monkeypatch.setenv("LOADER_READ_THREADS", "2")
    started: list[int] = []
    finished: list[int] = []

    def step(index: int) -> Any:
        def run(layer: nn.Module) -> None:
            started.append(index)
            if index in (1, 3):
                raise ValueError(f"layer {index} is damaged")
            time.sleep(0.2)
            finished.append(index)
        return run

    model = nn.Sequential(*(_Step(step(index)) for index in range(8)))
    with pytest.raises(ValueError, match="layer 1 is damaged"):
        _postprocess(model)
    assert sorted(finished) == sorted(i for i in started if i not in (1, 3))  # whatever started has ended
    assert len(started) < 8  # the tail was cancelled
    assert _live_workers() == []


def test_workers_run_torch_ops_on_one_thread_and_the_count_is_restored_after(monkeypatch):
    """Two workers with an OpenMP team each oversubscribe the CPUs; a thread started after the step gets the
    intra-op thread count it would have got before."""
    monkeypatch.setenv("LOADER_READ_THREADS", "2")
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # the suite runs with OMP_NUM_THREADS=1, where one thread would prove nothing
    try:
        seen: list[int] = []
        model = nn.Sequential(*(_Step(lambda layer: seen.append(torch.get_num_threads())) for _ in range(2)))
        _postprocess(model)
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    assert seen == [1, 1]
    assert after == 2 and later == [2]
