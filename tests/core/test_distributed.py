"""loader._distributed in one process: defaults, simulated ranks (the session's), no-op collectives, divide."""

from __future__ import annotations

import pytest
import torch

from loader import _distributed as distributed
from loader._session import current_session
from loader.errors import UnsupportedError


def _rank_size() -> tuple[int, int]:
    session = current_session()
    return session.tp_rank, session.tp_size


def test_defaults_without_a_process_group():
    assert _rank_size() == (0, 1)


def test_simulated_tp_nests_and_restores():
    with distributed.simulated_tp(1, 4):
        assert _rank_size() == (1, 4)
        with distributed.simulated_tp(0, 2):
            assert _rank_size() == (0, 2)
        assert _rank_size() == (1, 4)
    assert _rank_size() == (0, 1)


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 2), (0, 0)])
def test_simulated_tp_rejects_impossible_ranks(rank, size):
    with pytest.raises(ValueError, match="outside a tensor parallel group"):
        distributed.simulated_tp(rank, size).__enter__()


def test_collectives_are_identity_at_tp1():
    t = torch.arange(6.0).view(2, 3)
    assert distributed.all_reduce(t) is t
    assert distributed.all_gather(t, dim=0) is t
    with distributed.simulated_tp(1, 2):  # simulation changes answers, not collectives
        assert distributed.all_reduce(t) is t


@pytest.mark.parametrize("world", [None, "1"])
def test_init_distributed_is_a_noop_for_one_process(monkeypatch, world):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    distributed.init_distributed()
    distributed.init_distributed("cpu")
    assert not torch.distributed.is_initialized()


def test_init_distributed_keeps_an_existing_group(monkeypatch, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        distributed.init_distributed()  # would block waiting for a peer if it initialised again
        assert dist.is_initialized() and current_session().tp_size == 1
        t = torch.ones(3, dtype=torch.bfloat16)
        assert torch.equal(distributed.all_reduce(t), t)
    finally:
        dist.destroy_process_group()


def test_divide():
    assert distributed.divide(12, 4, "num_attention_heads") == 3
    with pytest.raises(UnsupportedError) as info:
        distributed.divide(6, 4, "num_attention_heads")
    assert str(info.value) == "num_attention_heads=6 is not divisible by tensor parallel size 4"
    with pytest.raises(UnsupportedError, match="intermediate_size=10 is not divisible by tensor parallel"):
        distributed.divide(10, 0, "intermediate_size")
