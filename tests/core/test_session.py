"""The load session: one place for host, TP rank/size, dtype and device, per thread, read by layers."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import attrs
import pytest
import torch

import loader
from loader._distributed import simulated_tp
from loader._pipeline.factory_dtype import factory_dtype
from loader._plugins import create_plugin_host, current_plugin_host
from loader._session import LoadSession, current_session, load_session
from loader.layers import ColumnParallelLinear, RMSNorm, VocabParallelEmbedding


def _session(**changes: object) -> LoadSession:
    return attrs.evolve(current_session(), **changes)  # type: ignore[arg-type]


def test_default_session_outside_a_load() -> None:
    session = current_session()
    assert (session.host, session.tp_rank, session.tp_size) == (None, 0, 1)
    assert session.dtype == torch.get_default_dtype() and session.device == torch.device("cpu")


def test_load_session_nests_and_restores() -> None:
    host = create_plugin_host(load_entry_points=False)
    with load_session(_session(host=host, dtype=torch.bfloat16)):
        assert current_plugin_host() is host
        with simulated_tp(1, 2):
            assert (current_session().tp_rank, current_session().tp_size) == (1, 2)
            assert current_session().dtype == torch.bfloat16  # only rank and size change
        assert current_session().tp_size == 1
    assert current_session().host is None


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 1), (0, 0)])
def test_an_impossible_rank_is_refused(rank: int, size: int) -> None:
    with pytest.raises(ValueError, match=f"rank {rank} is outside a tensor parallel group of size {size}"):
        _session(tp_rank=rank, tp_size=size)


def test_layers_read_the_sessions_dtype_and_rank() -> None:
    before = torch.get_default_dtype()
    with load_session(_session(dtype=torch.float16, tp_rank=1, tp_size=2)), torch.device("meta"):
        linear = ColumnParallelLinear(8, 12)
        norm = RMSNorm(8)
        embedding = VocabParallelEmbedding(100, 8)
    assert linear.weight.dtype == norm.weight.dtype == embedding.weight.dtype == torch.float16
    assert linear.weight.shape == (6, 8) and (linear.tp_rank, linear.tp_size) == (1, 2)
    assert embedding.vocab_start == 64
    assert torch.get_default_dtype() == before


def test_the_session_is_per_thread() -> None:
    seen: list[torch.dtype] = []
    with load_session(_session(dtype=torch.bfloat16)):
        thread = threading.Thread(target=lambda: seen.append(current_session().dtype))
        thread.start()
        thread.join()
    assert seen == [torch.get_default_dtype()]


def test_factory_dtype_gives_bare_factories_the_dtype_in_this_thread_only() -> None:
    seen: list[torch.dtype] = []
    with factory_dtype(torch.bfloat16):
        thread = threading.Thread(target=lambda: seen.append(torch.empty(2).dtype))
        thread.start()
        thread.join()
        assert torch.empty(2).dtype == torch.zeros(1).dtype == torch.bfloat16
        assert torch.full((2,), 1.5).dtype == torch.tensor([0.5]).dtype == torch.bfloat16
        assert torch.arange(3).dtype == torch.full((1,), 1).dtype == torch.int64  # integers stay integers
        assert torch.empty(2, dtype=torch.float32).dtype == torch.float32  # an explicit dtype wins
        assert torch.tensor(torch.ones(2, dtype=torch.float32)).dtype == torch.float32  # copies keep theirs
    assert seen == [torch.get_default_dtype()]
    assert torch.empty(2).dtype == torch.get_default_dtype()


def test_the_pipeline_names_no_format() -> None:
    """dummy and sharded_state are formats like any other: no format name is spelled in the pipeline."""
    pipeline = Path(loader.__file__).parent / "pipeline"
    names = {"dummy", "sharded_state", "safetensors", "pt", "gguf"}
    for path in pipeline.glob("*.py"):
        constants = {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert not constants & names, (path.name, constants & names)
