"""The process's budget of memory maps for parts mapped inside a region (loader._map_budget).

A synthetic many-expert parameter ``[experts, gate + up rows, cols]`` is filled part by part from a raw file
(:mod:`tests.helpers.raw_file_tensor`), each part located in its expert's rows as ``FusedMoE`` does.
"""

from __future__ import annotations

import gc
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from loader import _map_budget as mb
from loader import _mapped_parameters as mp
from loader._pipeline.materialize import materialize
from loader.weights import ReadStats
from tests.helpers.raw_file_tensor import RawFileTensor, write_raw

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mapping is Linux-only")

EXPERTS, ROWS, COLS = 24, 8, 1024  # each part 16 KiB, four pages
PAGE = 4096


@pytest.fixture(autouse=True)
def _mapping_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "1")
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", str(16 * 1024))


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        with torch.device("meta"):
            self.w13 = nn.Parameter(torch.empty(EXPERTS, 2 * ROWS, COLS, dtype=torch.bfloat16))


def _materialized() -> Experts:
    model = Experts()
    materialize(model, torch.device("cpu"))
    return model


def _checkpoint(path: Path, lead: int) -> tuple[torch.Tensor, list[int]]:
    """Every expert's gate then up, back to back after ``lead`` bytes; the values as the parameter holds them."""
    g = torch.Generator().manual_seed(0)
    expected = torch.randn(EXPERTS, 2 * ROWS, COLS, generator=g).to(torch.bfloat16)
    offsets = write_raw(path, [expected[e, i * ROWS:(i + 1) * ROWS] for e in range(EXPERTS) for i in range(2)], lead)
    return expected, offsets


def _rows(data: torch.Tensor, *, expert: int, first: int) -> torch.Tensor:
    return data[expert].narrow(0, first, ROWS)


def _land_all(param: torch.Tensor, path: Path, offsets: list[int], stats: ReadStats) -> None:
    for e in range(EXPERTS):
        for i in range(2):
            loaded = RawFileTensor(path, offsets[2 * e + i], (ROWS, COLS), torch.bfloat16, stats)
            mp.fill_parameter(param, loaded, locate=partial(_rows, expert=e, first=i * ROWS))


def _map_count() -> int:
    with open("/proc/self/maps", "rb") as fh:
        return sum(1 for _ in fh)


def test_every_part_of_a_page_aligned_file_is_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mp, "part_maps", mb.MapBudget())
    expected, offsets = _checkpoint(tmp_path / "w.bin", lead=PAGE)
    stats = ReadStats()
    param = _materialized().w13

    _land_all(param, tmp_path / "w.bin", offsets, stats)

    assert torch.equal(param.data, expected)
    assert stats.bytes_mapped == expected.nbytes


def test_parts_beyond_a_tiny_budget_are_copied_with_identical_values(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    budget = mb.MapBudget(20)
    monkeypatch.setattr(mp, "part_maps", budget)
    expected, offsets = _checkpoint(tmp_path / "w.bin", lead=1234)  # off the page: partial pages, 4 maps a part
    stats = ReadStats()
    param = _materialized().w13

    _land_all(param, tmp_path / "w.bin", offsets, stats)

    assert torch.equal(param.data, expected)
    assert mp.is_file_backed(param)
    assert 0 < stats.bytes_mapped < expected.nbytes // 4, "a few parts mapped, the rest copied"
    assert budget.left is not None and 0 <= budget.left < 4, "spent down to less than one part"


@pytest.mark.parametrize("lead", [PAGE, 1234])
def test_the_processs_map_count_stays_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        lead: int) -> None:
    budget = mb.MapBudget(40)
    monkeypatch.setattr(mp, "part_maps", budget)
    expected, offsets = _checkpoint(tmp_path / "w.bin", lead=lead)
    stats = ReadStats()
    param = _materialized().w13
    before = _map_count()

    _land_all(param, tmp_path / "w.bin", offsets, stats)

    grown = _map_count() - before
    assert grown <= mb.MAPS_PER_REGION + 40, f"{grown} maps added for {2 * EXPERTS} parts"
    assert budget.left is not None and budget.left < 4
    assert torch.equal(param.data, expected) and stats.bytes_mapped > 0


def test_maps_return_to_the_budget_when_the_region_is_unmapped(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    budget = mb.MapBudget(100)
    monkeypatch.setattr(mp, "part_maps", budget)
    _, offsets = _checkpoint(tmp_path / "w.bin", lead=1234)
    model = _materialized()
    _land_all(model.w13, tmp_path / "w.bin", offsets, ReadStats())
    assert budget.left is not None and budget.left < 100

    del model
    gc.collect()

    assert budget.left == 100


def _in_threads(*calls: partial[None]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_concurrent_loads_share_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = mb.MapBudget(60)
    monkeypatch.setattr(mp, "part_maps", budget)
    expected, offsets = _checkpoint(tmp_path / "w.bin", lead=1234)
    params = [_materialized().w13 for _ in range(3)]
    stats = [ReadStats() for _ in params]
    _in_threads(*[partial(print, end="") for _ in params])  # the threads' stacks, cached for the loads' threads
    before = _map_count()

    _in_threads(*[partial(_land_all, p, tmp_path / "w.bin", offsets, s) for p, s in zip(params, stats, strict=True)])

    grown = _map_count() - before
    assert all(torch.equal(p.data, expected) for p in params)
    assert all(s.bytes_mapped > 0 for s in stats)
    assert budget.left is not None and 0 <= budget.left < 4
    assert grown <= 3 * mb.MAPS_PER_REGION + 60, f"{grown} maps added by three loads"


def test_takes_from_many_threads_never_exceed_the_capacity() -> None:
    budget = mb.MapBudget(1000)
    granted: list[int] = []

    def taker() -> None:
        granted.append(sum(budget.take(1) for _ in range(400)))

    threads = [threading.Thread(target=taker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(granted) == 1000 and budget.left == 0


def test_the_default_budget_is_a_share_of_the_maps_left() -> None:
    left = mb.maps_left()
    assert left is not None and left > 0
    budget = mb.MapBudget()
    assert budget.take(1)
    assert budget.left is not None and budget.left <= left // mb.PART_SHARE
