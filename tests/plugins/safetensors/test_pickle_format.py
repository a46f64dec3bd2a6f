"""PyTorch ``.bin``/``.pt`` files: loaded with the safe unpickler, code-running pickles refused."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from loader.errors import CheckpointFormatError
from loader.weights import ReadStats
from loader_plugin_safetensors.pickle_format import iter_pt_weights


class _RunsCode:
    """Unpickling this calls ``os.system`` (what a malicious checkpoint does)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(10, 6, generator=g).bfloat16(),
            "model.norm.weight": torch.randn(6, generator=g)}


@pytest.mark.parametrize("zip_format", [True, False])
def test_bin_file_loads_with_values_and_counts(tmp_path, zip_format):
    state = _state()
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path, _use_new_zipfile_serialization=zip_format)
    stats = ReadStats()
    handles = dict(iter_pt_weights([str(path)], stats))
    assert set(handles) == set(state)
    embed = handles["model.embed_tokens.weight"]
    assert embed.file == str(path)
    assert torch.equal(embed.read(), state["model.embed_tokens.weight"])
    out = torch.empty(3, 6, dtype=torch.float32)
    embed.narrow(0, 2, 3).read_into(out)
    assert torch.equal(out, state["model.embed_tokens.weight"][2:5].float())
    assert stats.bytes_read == 10 * 6 * 2 + 3 * 6 * 2
    assert stats.tensors_read == 2


def test_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2), "payload": _RunsCode(str(marker))}, path)
    with pytest.raises(CheckpointFormatError) as info:
        list(iter_pt_weights([str(path)]))
    message = str(info.value)
    assert str(path) in message and "refused" in message and "would execute code" in message
    assert "posix.system" in message or "os.system" in message
    assert not marker.exists()


def test_plain_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "model.pt"
    with path.open("wb") as fh:
        pickle.dump({"w": _RunsCode(str(marker))}, fh, protocol=2)
    with pytest.raises(CheckpointFormatError, match="would execute code"):
        list(iter_pt_weights([str(path)]))
    assert not marker.exists()


def test_garbage_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointFormatError, match=r"junk\.bin: not a PyTorch checkpoint"):
        list(iter_pt_weights([str(path)]))


def test_truncated_zip_is_unreadable(tmp_path):
    path = tmp_path / "cut.bin"
    torch.save(_state(), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointFormatError, match=r"cut\.bin: (cannot read as|not) a PyTorch checkpoint"):
        list(iter_pt_weights([str(path)]))


def test_non_mapping_and_non_tensor_entries(tmp_path):
    listed = tmp_path / "list.bin"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(CheckpointFormatError, match=r"list\.bin: expected a state dict .* found list"):
        list(iter_pt_weights([str(listed)]))
    nested = tmp_path / "nested.bin"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, nested)
    expected = r"nested\.bin: entry 'state_dict' is a dict, expected a tensor"
    with pytest.raises(CheckpointFormatError, match=expected):
        list(iter_pt_weights([str(nested)]))


def test_same_name_in_two_bin_files_names_both(tmp_path):
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    torch.save(_state(0), one)
    torch.save({"model.norm.weight": torch.zeros(6)}, two)
    with pytest.raises(CheckpointFormatError) as info:
        list(iter_pt_weights([str(one), str(two)]))
    message = str(info.value)
    assert "'model.norm.weight' appears in two files" in message
    assert str(one) in message and str(two) in message


@pytest.mark.parametrize("content", [b"Q", b"\x80\x02Q", b"e"])
def test_pickle_that_breaks_the_unpickler_is_not_a_checkpoint(tmp_path, content):
    """Found by the .bin fuzzer: torch's weights-only unpickler raised a bare IndexError on these."""
    path = tmp_path / "broken.bin"
    path.write_bytes(content)
    with pytest.raises(CheckpointFormatError, match=r"broken\.bin: not a PyTorch checkpoint the safe unpickler"):
        list(iter_pt_weights([str(path)]))
