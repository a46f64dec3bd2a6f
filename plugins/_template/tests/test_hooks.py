"""The plugin is installed and loaded with both hooks, finds .npz archives and reads only what is asked."""

from __future__ import annotations

import numpy
import pytest
import torch
from loader_plugin_template import hooks

from loader.checkpoint import Source
from loader.errors import CheckpointFormatError
from loader.testing import create_plugin_host
from loader.weights import ReadStats

DISTRIBUTION = "loader-plugin-template"


def test_plugin_is_loaded_with_its_hooks():
    records = [r for r in create_plugin_host().records.values() if r.distribution == DISTRIBUTION]
    assert len(records) == 1, f"{DISTRIBUTION} is not installed (pip install it, then run the tests)"
    assert records[0].status == "loaded", records[0].error
    assert set(records[0].hooks) == {"loader_detect_format", "loader_iter_weights"}


@pytest.mark.parametrize("save", [numpy.savez, numpy.savez_compressed])
def test_reads_narrowed_arrays_of_a_folder(tmp_path, save):
    rng = numpy.random.default_rng(0)
    arrays = {"model.embed_tokens.weight": rng.standard_normal((6, 4), dtype=numpy.float32),
              "model.norm.weight": numpy.arange(4, dtype=numpy.float16)}
    save(tmp_path / "model.npz", **arrays)
    (tmp_path / "config.json").write_text("{}")
    source = Source(str(tmp_path), tmp_path)

    found = hooks.loader_detect_format(source, "auto")
    assert found is not None and (found.name, found.files) == ("npz", (str(tmp_path / "model.npz"),))
    assert hooks.loader_detect_format(source, "safetensors") is None

    stats = ReadStats()
    tensors = dict(hooks.loader_iter_weights(source, found, None, stats))  # type: ignore[arg-type]
    assert stats.bytes_read == 0, "iterating must read headers only"
    embed = tensors["model.embed_tokens.weight"]
    assert (embed.shape, embed.dtype) == ((6, 4), torch.float32)
    rows = embed.narrow(0, 2, 3).narrow(1, 1, 2)
    torch.testing.assert_close(rows.read(), torch.from_numpy(arrays["model.embed_tokens.weight"][2:5, 1:3]))
    assert stats.bytes_read == 3 * 4 * 4, "a dim-0 narrow reads only its rows"
    norm = tensors["model.norm.weight"].read(torch.float32)
    torch.testing.assert_close(norm, torch.arange(4, dtype=torch.float32))


def test_an_array_in_fortran_order_is_refused_by_name(tmp_path):
    numpy.savez(tmp_path / "model.npz", **{"lm_head.weight": numpy.zeros((3, 2), dtype=numpy.float32).T})
    weight_format = hooks.loader_detect_format(Source(str(tmp_path), tmp_path), "npz")
    with pytest.raises(CheckpointFormatError, match=r"'lm_head.weight.npy' in .*model.npz: stored in Fortran "
                                                    r"order; save numpy.ascontiguousarray\(array\)"):
        list(hooks.loader_iter_weights(None, weight_format, None, ReadStats()))  # type: ignore[arg-type]


def _write_objects(path):
    numpy.savez(path, **{"lm_head.weight": numpy.array([{"not": "a number"}], dtype=object)})


def _write_void(path):  # what bfloat16 arrays from ml_dtypes look like to a reader without it
    numpy.savez(path, **{"lm_head.weight": numpy.zeros(4, dtype="V2")})


def _write_text_member(path):
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("README.txt", "weights elsewhere")


def _write_not_a_zip(path):
    path.write_bytes(b"not an archive")


@pytest.mark.parametrize(("write", "message"), [
    (_write_objects, r"'lm_head.weight.npy' in .*model.npz: dtype object has no torch equivalent"),
    (_write_void, r"'lm_head.weight.npy' in .*model.npz: dtype \|V2 has no torch equivalent; save numbers "
                  r"\(bfloat16 as t.float\(\).numpy\(\)\)"),
    (_write_text_member, r"'README.txt' in .*model.npz: not a .npy array"),
    (_write_not_a_zip, r".*model.npz: not a readable .npz archive \(File is not a zip file\)"),
])
def test_what_cannot_be_a_weight_is_refused_with_the_file_named(tmp_path, write, message):
    write(tmp_path / "model.npz")
    weight_format = hooks.loader_detect_format(Source(str(tmp_path), tmp_path), "npz")
    with pytest.raises(CheckpointFormatError, match=message):
        list(hooks.loader_iter_weights(None, weight_format, None, ReadStats()))  # type: ignore[arg-type]
