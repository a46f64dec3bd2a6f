"""Two loads in two threads at once: each gets its own dtype, and torch's default dtype is left alone.

The builds are made to overlap the same way every time: the first thread's
build waits until the second is building, and the second finishes building
only after the first load has returned. A load that set and restored torch's
process-wide default dtype around the build gives each thread the other's (or
the original) dtype and leaves the default changed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

import loader
from loader._context import ModelContext
from loader._plugins import PluginHost, create_plugin_host
from loader.checkpoint import WeightFormat
from loader.weights import EagerTensor
from tests.core.fake_model import TinyForCausalLM

HIDDEN = 4
FIRST_BUILDING, SECOND_BUILDING, FIRST_DONE = threading.Event(), threading.Event(), threading.Event()


class MeetingTiny(TinyForCausalLM):
    """The tiny model, whose construction waits for the other thread's as the config's ``role`` says."""

    def __init__(self, ctx: ModelContext) -> None:
        role = ctx.hf_config.get("role")
        if role == "first":
            FIRST_BUILDING.set()
            assert SECOND_BUILDING.wait(30)
        elif role == "second":
            SECOND_BUILDING.set()
            assert FIRST_DONE.wait(30)
        super().__init__(ctx)


class FolderTensors:
    """Serves ``weights.pt`` of a folder (torch.save of a dict) as the ``memory`` format."""

    @loader.hookimpl
    def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
        path = source.path / "weights.pt"
        if requested in ("auto", "memory") and path.exists():
            return WeightFormat("memory", (str(path),))
        return None

    @loader.hookimpl
    def loader_iter_weights(self, weight_format):  # type: ignore[no-untyped-def]
        if weight_format.name != "memory":
            return None
        tensors = torch.load(weight_format.files[0], weights_only=True)
        return iter([(name, EagerTensor(t, name, weight_format.files[0])) for name, t in tensors.items()])


class MeetingModels:
    @loader.hookimpl
    def loader_register_architectures(self, register):  # type: ignore[no-untyped-def]
        register("MeetingTiny", "tests.core.test_concurrent_loads:MeetingTiny")


def _host() -> PluginHost:
    host = create_plugin_host(load_entry_points=False)
    host.register(FolderTensors(), "memory")
    host.register(MeetingModels(), "meeting")
    return host


def _checkpoint(folder: Path, vocab: int, seed: int, role: str | None) -> Path:
    folder.mkdir()
    generator = torch.Generator().manual_seed(seed)
    torch.save({"embed.weight": torch.randn(vocab, HIDDEN, generator=generator),
                "head.weight": torch.randn(vocab, HIDDEN, generator=generator)}, folder / "weights.pt")
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["MeetingTiny"], "vocab_size": vocab, "hidden_size": HIDDEN, "role": role}))
    return folder


def test_two_threads_load_different_models_and_dtypes_at_once(tmp_path: Path) -> None:
    host = _host()
    requests = {"bfloat16": (10, 1, "first"), "float16": (12, 2, "second")}
    sequential = {
        dtype: loader.load_model(str(_checkpoint(tmp_path / f"seq-{dtype}", vocab, seed, None)),
                                 dtype=dtype, host=host)
        for dtype, (vocab, seed, _) in requests.items()
    }
    folders = {dtype: _checkpoint(tmp_path / f"par-{dtype}", vocab, seed, role)
               for dtype, (vocab, seed, role) in requests.items()}
    before = torch.get_default_dtype()
    results: dict[str, torch.nn.Module] = {}
    errors: list[BaseException] = []

    def load(dtype: str) -> None:
        try:
            results[dtype] = loader.load_model(str(folders[dtype]), dtype=dtype, host=host)
        except BaseException as exc:
            errors.append(exc)

    for event in (FIRST_BUILDING, SECOND_BUILDING, FIRST_DONE):
        event.clear()
    first, second = (threading.Thread(target=load, args=(dtype,)) for dtype in requests)
    first.start()
    assert FIRST_BUILDING.wait(30)
    second.start()
    first.join(timeout=60)
    FIRST_DONE.set()
    second.join(timeout=60)
    assert not errors, errors
    assert torch.get_default_dtype() == before
    ids = torch.tensor([[1, 2, 3, 9]])
    for dtype, model in results.items():
        expected = sequential[dtype]
        assert model.embed.dtype == model.head.dtype == getattr(torch, dtype)
        assert torch.equal(model.embed, expected.embed) and torch.equal(model.head, expected.head)
        assert torch.equal(model(ids), expected(ids))
