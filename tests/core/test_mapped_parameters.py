"""Parameters whose pages are mapped from the checkpoint file (loader._mapped_parameters).

A raw file of bf16 values stands in for a format (:mod:`tests.helpers.raw_file_tensor`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from loader import _map_budget as mb
from loader import _mapped_parameters as mp
from loader import _page_population as pp
from loader._pipeline.materialize import materialize
from loader.errors import CheckpointFormatError
from loader.weights import CheckpointTensor, ReadStats
from tests.helpers.raw_file_tensor import RawFileTensor, write_raw

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mapping is Linux-only")

PAGE = 4096


class Holder(nn.Module):
    def __init__(self, *shapes: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        with torch.device("meta"):
            self.params = nn.ParameterList([nn.Parameter(torch.empty(s, dtype=dtype)) for s in shapes])


@pytest.fixture(autouse=True)
def _small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "1")
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", str(16 * 1024))


def _materialized(*shapes: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> Holder:
    model = Holder(*shapes, dtype=dtype)
    materialize(model, torch.device("cpu"))
    return model


def _values(rows: int, cols: int = 1024, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_a_whole_tensor_is_mapped_bit_exact_and_counted(tmp_path: Path) -> None:
    weight = _values(48)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=1234)
    stats = ReadStats()
    param = _materialized((48, 1024)).params[0]

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (48, 1024), torch.bfloat16, stats))

    assert mp.is_file_backed(param)
    assert (param.data_ptr() - offset) % PAGE == 0, "the parameter moved to an address congruent to the file"
    assert torch.equal(param.data, weight)
    assert stats.bytes_read == weight.nbytes and stats.tensors_read == 1
    assert 0 < stats.bytes_mapped <= weight.nbytes


def test_writing_a_mapped_parameter_leaves_the_file_alone(tmp_path: Path) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=100)
    before = (tmp_path / "w.bin").read_bytes()
    param = _materialized((32, 1024)).params[0]
    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))

    with torch.no_grad():
        param.mul_(2)

    assert torch.equal(param.data, weight * 2)
    assert (tmp_path / "w.bin").read_bytes() == before, "private mapping: writes are copy-on-write"


def test_fused_parts_congruent_in_the_file_all_map(tmp_path: Path) -> None:
    q, k, v = _values(16, seed=1), _values(8, seed=2), _values(8, seed=3)
    offsets = write_raw(tmp_path / "w.bin", [k, q, v], lead=778)  # file order differs from the fused order
    stats = ReadStats()
    param = _materialized((32, 1024)).params[0]
    parts = {"q": (q, offsets[1], 0), "k": (k, offsets[0], 16), "v": (v, offsets[2], 24)}
    for name in ("k", "q", "v"):  # the order the file offers them in
        values, offset, row = parts[name]
        rows, cols = values.shape
        loaded = RawFileTensor(tmp_path / "w.bin", offset, (rows, cols), torch.bfloat16, stats)
        mp.fill_parameter(param, loaded, 0, row)

    assert torch.equal(param.data, torch.cat([q, k, v]))
    assert stats.bytes_read == param.numel() * 2
    assert stats.bytes_mapped > 0.8 * param.numel() * 2


def test_a_part_that_is_not_congruent_is_read_instead(tmp_path: Path) -> None:
    q, k = _values(16, seed=1), _values(16, seed=2)
    offsets = write_raw(tmp_path / "w.bin", [q, k], lead=512, gap=6)  # the gap shifts k off q's phase
    stats = ReadStats()
    param = _materialized((32, 1024)).params[0]
    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offsets[0], (16, 1024), torch.bfloat16, stats), 0, 0)
    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offsets[1], (16, 1024), torch.bfloat16, stats),
                      0, 16)

    assert torch.equal(param.data, torch.cat([q, k]))
    assert stats.bytes_mapped <= q.nbytes, "only q was mapped"


def test_a_parameter_already_written_does_not_move(tmp_path: Path) -> None:
    q, k = _values(16, seed=1), _values(16, seed=2)
    offsets = write_raw(tmp_path / "w.bin", [q, k], lead=300)
    param = _materialized((32, 1024)).params[0]
    address = param.data_ptr()
    with torch.no_grad():
        param.data[:16].copy_(q)  # written by someone else first: moving the parameter would lose it

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offsets[1], (16, 1024), torch.bfloat16), 0, 16)

    assert param.data_ptr() == address
    assert torch.equal(param.data, torch.cat([q, k]))
    assert not mp.is_file_backed(param), "k was not congruent where the parameter stayed: it was read"


def test_what_cannot_be_mapped_is_read(tmp_path: Path) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=64)
    loaded = RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16)
    model = _materialized((32, 1024), (32, 512), dtype=torch.float32)

    mp.fill_parameter(model.params[0], loaded)  # another dtype: converted on read
    mp.fill_parameter(model.params[1], loaded.narrow(1, 512, 512))  # an inner-dim narrow: strided

    assert torch.equal(model.params[0].data, weight.float())
    assert torch.equal(model.params[1].data, weight[:, 512:].float())
    assert not mp.is_file_backed(model.params[0]) and not mp.is_file_backed(model.params[1])


def test_a_dim0_narrow_maps_only_this_ranks_rows(tmp_path: Path) -> None:
    weight = _values(64)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=4000)
    stats = ReadStats()
    param = _materialized((32, 1024)).params[0]

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (64, 1024), torch.bfloat16, stats)
                      .narrow(0, 32, 32))

    assert torch.equal(param.data, weight[32:])
    assert stats.bytes_read == weight.nbytes // 2


def test_switched_off_nothing_is_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "0")
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=64)
    stats = ReadStats()
    param = _materialized((32, 1024)).params[0]

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16, stats))

    assert torch.equal(param.data, weight)
    assert not mp.is_file_backed(param) and stats.bytes_mapped == 0


def test_small_tensors_share_the_arena_and_are_read(tmp_path: Path) -> None:
    weight = _values(2, 512)  # 2 KiB, under the 16 KiB threshold of these tests
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=64)
    param = _materialized((2, 512)).params[0]

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (2, 512), torch.bfloat16))

    assert torch.equal(param.data, weight) and not mp.is_file_backed(param)


def test_a_file_shorter_than_promised_is_refused_before_mapping(tmp_path: Path) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=64)
    with (tmp_path / "w.bin").open("r+b") as fh:
        fh.truncate(offset + weight.nbytes - 10)
    param = _materialized((32, 1024)).params[0]

    with pytest.raises(CheckpointFormatError, match=r"w\.bin@?.*file ends at byte \d+, before the data the header "
                                                    r"promises .* the file is truncated"):
        mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))


def test_population_is_deferred_to_the_end_of_the_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = [_values(32, seed=s) for s in range(3)]
    offsets = write_raw(tmp_path / "w.bin", weights, lead=64)
    model = _materialized(*[(32, 1024)] * 3)
    populated: list[int] = []
    real = pp._populate

    def recording(address: int, length: int, loaded: CheckpointTensor) -> None:
        populated.append(length)
        real(address, length, loaded)

    monkeypatch.setattr(pp, "_populate", recording)

    with pp.background_population():
        for param, offset in zip(model.params, offsets, strict=True):
            mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))
        assert populated == [], "nothing populated while parameters are still being mapped"

    assert len(populated) == 3
    assert all(torch.equal(p.data, w) for p, w in zip(model.params, weights, strict=True))


def test_a_population_failure_is_raised_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=64)
    param = _materialized((32, 1024)).params[0]

    def failing(address: int, length: int, loaded: CheckpointTensor) -> None:
        raise CheckpointFormatError(f"{loaded.describe()}: cannot read the file's pages: Input/output error")

    monkeypatch.setattr(pp, "_populate", failing)
    with pytest.raises(CheckpointFormatError, match="cannot read the file's pages: Input/output error"), \
            pp.background_population():
        mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))


def test_tied_owners_see_the_moved_parameter(tmp_path: Path) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=2222)
    with torch.device("meta"):
        embed, head = nn.Embedding(32, 1024, dtype=torch.bfloat16), nn.Linear(1024, 32, bias=False,
                                                                              dtype=torch.bfloat16)
    head.weight = embed.weight
    model = nn.ModuleDict({"embed": embed, "head": head})
    materialize(model, torch.device("cpu"))

    mp.fill_parameter(embed.weight, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))

    assert head.weight is embed.weight and torch.equal(head.weight.data, weight)


def test_values_at_an_odd_offset_are_read_not_mapped(tmp_path: Path) -> None:
    weight = _values(32)
    (offset,) = write_raw(tmp_path / "w.bin", [weight], lead=777)  # a bf16 value straddling its alignment
    param = _materialized((32, 1024)).params[0]

    mp.fill_parameter(param, RawFileTensor(tmp_path / "w.bin", offset, (32, 1024), torch.bfloat16))

    assert torch.equal(param.data, weight) and not mp.is_file_backed(param)


def test_within_the_memory_map_budget_the_largest_tensors_get_regions(monkeypatch: pytest.MonkeyPatch) -> None:
    from loader._pipeline import materialize as materialize_module

    monkeypatch.setattr(materialize_module, "region_budget", lambda: 2)
    model = _materialized((8, 1024), (64, 1024), (16, 1024), (32, 1024))

    with_region = [getattr(p, "_loader_region", None) is not None for p in model.params]
    assert with_region == [False, True, False, True]


def test_the_budget_leaves_room_under_the_kernels_map_limit() -> None:
    with open("/proc/sys/vm/max_map_count", encoding="ascii") as fh:
        limit = int(fh.read())
    assert 0 < mb.region_budget() * 8 <= limit // 2
