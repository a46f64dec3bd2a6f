"""Detection: a .gguf file, a folder with one GGUF model, split sets; mistakes named."""

from __future__ import annotations

import shutil

import pytest

from loader.checkpoint import Source
from loader.errors import CheckpointFormatError, UnsupportedError
from loader_plugin_gguf.format.detect import detect_gguf
from tests.helpers.gguf_files import raw_header


def source(path):
    return Source(location=str(path), path=path)


def files(path, requested="auto"):
    found = detect_gguf(source(path), requested)
    assert found is not None and found.name == "gguf"
    return found.files


def valid(path):
    path.write_bytes(raw_header() + b"\0" * 8)
    return path


def test_single_file_by_magic_even_without_the_suffix(tmp_path):
    plain = valid(tmp_path / "model.bin")
    found = detect_gguf(source(plain), "auto")
    assert found is not None
    assert (found.name, found.files) == ("gguf", (str(plain),))


def test_folder_holding_one_model(tmp_path):
    file = valid(tmp_path / "m.Q4_0.gguf")
    (tmp_path / "README.md").write_text("x")
    assert files(tmp_path, "gguf") == (str(file),)


def test_split_set_lists_every_part_in_order_from_any_part(tmp_path):
    parts = [valid(tmp_path / f"m-{i:05d}-of-00003.gguf") for i in (3, 1, 2)]
    ordered = tuple(str(tmp_path / f"m-{i:05d}-of-00003.gguf") for i in (1, 2, 3))
    assert files(tmp_path) == ordered
    assert files(parts[0]) == ordered


def test_incomplete_split_set_names_missing_parts(tmp_path):
    valid(tmp_path / "m-00001-of-00003.gguf")
    valid(tmp_path / "m-00003-of-00003.gguf")
    with pytest.raises(CheckpointFormatError, match=r"split GGUF set is incomplete; missing m-00002-of-00003\.gguf"):
        detect_gguf(source(tmp_path), "auto")


def test_folder_with_several_models_asks_for_the_file(tmp_path):
    valid(tmp_path / "a.gguf")
    valid(tmp_path / "b.gguf")
    with pytest.raises(CheckpointFormatError, match=r"folder holds several GGUF models \(a\.gguf, b\.gguf\)"):
        detect_gguf(source(tmp_path), "auto")


def test_gguf_suffix_with_wrong_magic_is_an_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\3\4" + b"\0" * 64)
    with pytest.raises(CheckpointFormatError, match=r"bad\.gguf: not a GGUF file: starts with b'PK\\x03\\x04'"):
        detect_gguf(source(bad), "auto")


def test_unsupported_version_is_reported_at_detection(tmp_path):
    old = tmp_path / "old.gguf"
    old.write_bytes(raw_header(version=1) + b"\0" * 8)
    with pytest.raises(UnsupportedError, match=r"old\.gguf: GGUF version 1 is not supported"):
        detect_gguf(source(old), "auto")


def test_other_sources_and_formats_are_left_to_other_plugins(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"{}")
    assert detect_gguf(source(tmp_path), "auto") is None
    assert detect_gguf(source(tmp_path / "model.safetensors"), "auto") is None
    valid(tmp_path / "m.gguf")
    assert detect_gguf(source(tmp_path), "safetensors") is None
    assert detect_gguf(Source(location="s3://b/p", path=None, uri="s3://b/p"), "auto") is None


def test_asking_for_gguf_where_there_is_none_says_so(tmp_path):
    with pytest.raises(CheckpointFormatError, match="no .gguf file here"):
        detect_gguf(source(tmp_path), "gguf")


def test_detection_through_the_plugin_host(tmp_path, tiny_gguf):
    from loader._hooks import detect_format
    from loader._plugins import create_plugin_host

    path, _ = tiny_gguf("qwen2")
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    found = detect_format(source(folder), "auto", host=create_plugin_host())
    assert (found.name, found.files) == ("gguf", (str(folder / path.name),))
