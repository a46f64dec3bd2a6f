"""``loader.kernels.PackedBundle``: what a quantize method packed, kept on disk and mapped by the next load.

The GGUF plugin's tests (tests/plugins/gguf/packed/test_bundle_keys.py) run it through real loads; these use it
directly, as any quantize method would.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from loader.kernels import LoadBundle, PackedBundle, packing_salt, source_identity

EXPECTED = {"data": (torch.uint8, (4, 8)), "scales": (torch.bfloat16, (2, 4))}


def _unit(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"data": torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=generator),
            "scales": torch.randn(2, 4, generator=generator).to(torch.bfloat16)}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"checkpoint bytes")
    return path


def _bundle(folder: Path, source: Path, **kwargs: object) -> PackedBundle:
    options: dict = {"variant": {"tp_rank": 0}, "salt": {"code": "v1"}, "max_bytes": 1 << 30, **kwargs}
    return PackedBundle(folder, [str(source)], options.pop("variant"), options.pop("salt"), **options)


def test_a_unit_built_once_is_mapped_by_the_next_load_bit_for_bit(tmp_path, source):
    first = _bundle(tmp_path / "bundles", source)
    built = first.cached("layer.0", lambda: _unit(0), EXPECTED)
    assert built is not None and first.lookup("layer.1", EXPECTED) is None
    first.finish()
    assert first.describe() == {"path": str(first.path), "hits": 0, "misses": 1, "written": True, "notes": []}
    assert not list((tmp_path / "bundles").glob("*.tmp"))
    second = _bundle(tmp_path / "bundles", source)
    found = second.cached("layer.0", lambda: pytest.fail("packed again"), EXPECTED)
    assert found is not None and all(torch.equal(found[name], built[name]) for name in built)
    found["data"].zero_()  # a copy-on-write map: the file keeps its bytes
    second.finish()
    assert second.describe()["hits"] == 1 and not second.written
    third = _bundle(tmp_path / "bundles", source)
    again = third.lookup("layer.0", EXPECTED)
    assert again is not None and torch.equal(again["data"], built["data"])


def test_a_unit_the_bundle_cannot_hold_is_not_stored(tmp_path, source):
    bundle = _bundle(tmp_path / "bundles", source)
    assert bundle.cached("layer.0", lambda: None, EXPECTED) is None
    bundle.finish()
    assert bundle.describe()["misses"] == 0 and not (tmp_path / "bundles").exists()


@pytest.mark.parametrize("change", ["source", "salt", "variant"])
def test_another_source_salt_or_variant_is_another_bundle(tmp_path, source, change):
    first = _bundle(tmp_path, source)
    first.cached("layer.0", lambda: _unit(0), EXPECTED)
    first.finish()
    if change == "source":
        time.sleep(0.01)
        source.write_bytes(b"other checkpoint")
    other = _bundle(tmp_path, source, **({"salt": {"code": "v2"}} if change == "salt" else {}),
                    **({"variant": {"tp_rank": 1}} if change == "variant" else {}))
    assert other.lookup("layer.0", EXPECTED) is None
    assert other.path != first.path and other.notes == []


def test_a_stored_unit_of_other_shapes_is_packed_again_and_noted(tmp_path, source):
    first = _bundle(tmp_path, source)
    first.cached("layer.0", lambda: _unit(0), EXPECTED)
    first.finish()
    second = _bundle(tmp_path, source)
    assert second.lookup("layer.0", {**EXPECTED, "data": (torch.uint8, (8, 4))}) is None
    assert second.notes == ["a stored unit (data, scales) did not have the expected shapes; packed again"]


def test_a_bundle_of_another_kind_or_a_damaged_one_is_noted_and_the_load_goes_on(tmp_path, source):
    first = _bundle(tmp_path, source, magic=b"OTHERPK\x01")
    first.cached("layer.0", lambda: _unit(0), EXPECTED)
    first.finish()
    mine = _bundle(tmp_path, source, kind="packed test")
    assert mine.lookup("layer.0", EXPECTED) is None
    assert mine.notes == [f"{first.path.name} not read: not a packed test bundle (bad magic)"]
    with pytest.raises(ValueError, match="8 bytes"):
        _bundle(tmp_path, source, magic=b"short")


def test_the_least_recently_used_bundles_go_beyond_the_size_limit(tmp_path):
    paths = []
    for index in range(3):
        source = tmp_path / f"weights{index}.bin"
        source.write_bytes(b"x" * (index + 1))
        bundle = _bundle(tmp_path / "bundles", source)
        bundle.cached("layer.0", lambda: _unit(0), EXPECTED)
        bundle.finish()
        paths.append(bundle.path)
        old = time.time() - 100 + index
        os.utime(bundle.path, (old, old))
    size = paths[0].stat().st_size
    last = tmp_path / "weights3.bin"
    last.write_bytes(b"y")
    bundle = _bundle(tmp_path / "bundles", last, max_bytes=2 * size + size // 2)
    bundle.cached("layer.0", lambda: _unit(0), EXPECTED)
    bundle.finish()
    assert sorted((tmp_path / "bundles").glob("*.bin")) == sorted([paths[2], bundle.path])


def test_the_salt_digests_the_method_s_code_and_the_core_s(tmp_path):
    from loader.kernels import packed_layout_fingerprint

    code = tmp_path / "packer.py"
    code.write_text("PACK = 1\n")
    salt = packing_salt([code], format=3)
    assert salt == {"format": 3, "code": salt["code"], "core": packed_layout_fingerprint()}
    code.write_text("PACK = 2\n")
    assert packing_salt([code], format=3)["code"] != salt["code"]


def test_a_source_s_identity_changes_with_the_file(source):
    before = source_identity([str(source)])
    assert before[0]["path"] == str(source.resolve()) and before[0]["size"] == len(b"checkpoint bytes")
    time.sleep(0.01)
    source.write_bytes(b"checkpoint bytez")
    assert source_identity([str(source)]) != before


def _counting_opener(folder: Path, source: Path, calls: list[int], none_first: int = 0) -> PackedBundle | None:
    calls.append(1)
    if len(calls) <= none_first:
        return None  # e.g. a load on another device: no bundle (yet)
    return _bundle(folder, source)


def test_a_load_bundle_is_made_once_by_the_first_of_many_threads_then_written_and_let_go(tmp_path, source):
    """``LoadBundle``: the lifecycle every packing method shares (made on first use from any worker thread,
    written by ``finish`` once the load succeeded, let go so the configs holding it pickle)."""
    import functools
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    calls: list[int] = []
    load = LoadBundle(functools.partial(_counting_opener, tmp_path / "bundles", source, calls))
    with ThreadPoolExecutor(8) as pool:
        opened = list(pool.map(lambda _: load.open(), range(32)))
    assert len(calls) == 1 and all(bundle is opened[0] and bundle is not None for bundle in opened)
    assert opened[0] is not None and opened[0].cached("unit", lambda: _unit(1), EXPECTED) is not None
    load.finish()
    assert load.bundle is None and load.open() is None  # finished: later layers (a live update) never use it
    assert load.describe() == opened[0].describe() and load.describe()["written"]
    assert pickle.loads(pickle.dumps(load)).describe() == load.describe()
    second = _bundle(tmp_path / "bundles", source)
    assert torch.equal(second.cached("unit", lambda: _unit(2), EXPECTED)["data"], _unit(1)["data"])


def test_a_load_bundle_whose_opener_makes_none_asks_again_and_finishes_nothing(tmp_path, source):
    import functools

    calls: list[int] = []
    load = LoadBundle(functools.partial(_counting_opener, tmp_path / "bundles", source, calls, none_first=2))
    assert load.open() is None and load.open() is None and load.describe() is None
    load.finish()
    assert load.open() is not None and len(calls) == 3
