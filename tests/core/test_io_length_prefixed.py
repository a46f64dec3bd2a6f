"""``loader.io.u64_prefixed_end``: where an array of uint64-length-prefixed records ends (GGUF string arrays).

The compiled walker and the Python loop a machine without a C compiler runs must agree on every array, whole
or cut short, and neither may read past the buffer.
"""

from __future__ import annotations

import mmap
import random
import shutil
import struct

import pytest

from loader import _length_prefixed
from loader.errors import SettingError
from loader.io import u64_prefixed_end

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) here")


def _records(lengths: list[int], seed: int = 0) -> bytes:
    rng = random.Random(seed)
    return b"".join(struct.pack("<Q", n) + bytes(rng.randrange(256) for _ in range(n)) for n in lengths)


@pytest.fixture(params=["compiled", "python"])
def walk(request):
    if request.param == "compiled" and _length_prefixed._compiled() is None:
        pytest.skip("no C compiler (cc) here")
    compiled = request.param == "compiled"
    return lambda buffer, start, count: u64_prefixed_end(buffer, start, count, compiled=compiled)


def test_a_whole_array_ends_after_its_last_record(walk):
    lengths = [random.Random(1).choice([0, 1, 3, 17, 255, 256, 1000]) for _ in range(500)]
    head = b"header!"
    data = head + _records(lengths) + b"tensor table"
    assert walk(data, len(head), len(lengths)) == (len(data) - len(b"tensor table"), len(lengths))
    assert walk(data, len(head), 3) == (len(head) + sum(8 + n for n in lengths[:3]), 3)


def test_no_records_end_where_they_start(walk):
    assert walk(b"\0" * 16, 5, 0) == (5, 0)


@pytest.mark.parametrize("cut", ["inside the last string", "inside the last length", "a length past the end",
                                 "a length near 2**64"])
def test_a_record_running_past_the_end_is_the_count_walked_before_it(walk, cut):
    whole = _records([4, 0, 9])
    data = {
        "inside the last string": whole[:-3],
        "inside the last length": whole[:8 + 4 + 8 + 5],
        "a length past the end": whole[:-17] + struct.pack("<Q", 10) + b"123456789",
        "a length near 2**64": whole[:-17] + struct.pack("<Q", 2**64 - 5) + b"123456789",
    }[cut]
    expected_end = 8 + 4 + 8  # after the first two records
    assert walk(data, 0, 3) == (expected_end, 2)


def test_a_read_only_file_map_is_walked_in_place(walk, tmp_path):
    data = b"GGUF" + _records([2, 70, 0, 5]) + b"rest"
    path = tmp_path / "strings.bin"
    path.write_bytes(data)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert walk(mapped, 4, 4) == (len(data) - 4, 4)


def test_a_start_outside_the_buffer_is_refused_by_name():
    with pytest.raises(ValueError, match="start 20 is outside the buffer of 10 bytes"):
        u64_prefixed_end(b"\0" * 10, 20, 1)


def test_the_two_walks_agree_on_random_arrays_cut_anywhere():
    if _length_prefixed._compiled() is None:
        pytest.skip("no C compiler (cc) here")
    rng = random.Random(7)
    for trial in range(200):
        data = _records([rng.choice([0, 1, 5, 40]) for _ in range(rng.randrange(1, 30))], seed=trial)
        data = data[:rng.randrange(len(data) + 1)]
        count = rng.randrange(40)
        assert (u64_prefixed_end(data, 0, count) == u64_prefixed_end(data, 0, count, compiled=False)), trial


@needs_compiler
def test_without_a_compiler_the_python_loop_walks(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    _length_prefixed._compiled.cache_clear()
    try:
        assert _length_prefixed._compiled() is None
        assert u64_prefixed_end(_records([3, 1]), 0, 2) == (8 + 3 + 8 + 1, 2)
    finally:
        _length_prefixed._compiled.cache_clear()


@needs_compiler  # without one, nothing reads the cache folder's setting
def test_a_bad_cache_folder_setting_is_raised_with_the_mapped_file_still_closable(monkeypatch, tmp_path):
    """Finding the compiled walker reads ``LOADER_CACHE_DIR``; its error must be what the caller sees. It was
    raised while the walk held an export of the caller's map, so closing the map on the way out failed with
    ``BufferError: cannot close exported pointers exist`` and hid it (a GGUF load with a relative cache folder)."""
    path = tmp_path / "strings.bin"
    path.write_bytes(_records([2, 3]))
    monkeypatch.setenv("LOADER_CACHE_DIR", "relative/cache")
    _length_prefixed._compiled.cache_clear()
    try:
        with (pytest.raises(SettingError, match=r"LOADER_CACHE_DIR='relative/cache': expected an absolute path"),
              path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped):
            u64_prefixed_end(mapped, 0, 2)
    finally:
        _length_prefixed._compiled.cache_clear()


def test_a_start_outside_a_mapped_file_is_refused_and_the_map_closes(tmp_path):
    path = tmp_path / "strings.bin"
    path.write_bytes(b"\0" * 10)
    with (pytest.raises(ValueError, match="start 20 is outside the buffer of 10 bytes"),
          path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped):
        u64_prefixed_end(mapped, 20, 1)
