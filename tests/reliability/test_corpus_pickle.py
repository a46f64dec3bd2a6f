"""Hostile and broken PyTorch ``.bin`` checkpoints: refused, and nothing in them ever runs."""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from loader.errors import CheckpointFormatError
from tests.helpers.malformed import PICKLE_LAYOUTS, llama_tensors, write_code_running_pickle, write_config
from tests.helpers.pickle_zips import data_record_names, repack_zip
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

BIN = "pytorch_model.bin"


def _hostile(layout: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_config(model)
        marker = folder / "pwned"
        write_code_running_pickle(model / BIN, marker, layout=layout)
        return Built(model, (str(model / BIN), "would execute code", "exec"), marker=marker)

    return build


def _bin(write: Callable[[Path], None], *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_config(model)
        write(model / BIN)
        return Built(model, (str(model / BIN), *fragments))

    return build


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x80\x02garbage that is not a pickle" * 4)


def _truncated_zip(path: Path) -> None:
    torch.save(llama_tensors(), path)
    path.write_bytes(path.read_bytes()[:300])


def _a_list(path: Path) -> None:
    torch.save([torch.zeros(2)], path)


def _nested(path: Path) -> None:
    torch.save({"state_dict": dict(llama_tensors())}, path)


def _short_storage_record(path: Path) -> None:
    saved = path.with_suffix(".saved")
    torch.save(llama_tensors(), saved)
    last = data_record_names(saved)[-1]
    repack_zip(saved, path, edit=lambda name, data: data[:-4] if name == last else data)
    saved.unlink()


def _rebuilt(edit_names: dict[str, int | None], added: tuple[str, bytes] | None = None
             ) -> Callable[[Path], None]:
    """``torch.save`` output rebuilt with some records dropped (``None``) or given a compression method."""

    def write(path: Path) -> None:
        saved = path.with_suffix(".saved")
        torch.save(llama_tensors(), saved)
        with zipfile.ZipFile(saved) as original, zipfile.ZipFile(path, "w") as rebuilt:
            for info in original.infolist():
                suffix = info.filename.split("/", 1)[1]
                method = edit_names.get(suffix, zipfile.ZIP_STORED)
                if method is not None:
                    rebuilt.writestr(info.filename, original.read(info), compress_type=method)
            if added is not None:
                rebuilt.writestr(f"{path.stem}/{added[0]}", added[1])
        saved.unlink()

    return write


def _index_outside(folder: Path) -> Built:
    model = folder / "model"
    write_config(model)
    torch.save(llama_tensors(), model / BIN)
    outside = folder / "outside.bin"
    torch.save(llama_tensors(), outside)
    index = {"weight_map": {"model.norm.weight": BIN, "lm_head.weight": "../outside.bin"}}
    (model / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return Built(model, ("pytorch_model.bin.index.json", "'../outside.bin'", "points outside the model folder"),
                 outside=outside)


CASES = [
    *[CorpusCase(f"bin-runs-code-{layout}", _hostile(layout), CheckpointFormatError) for layout in PICKLE_LAYOUTS],
    CorpusCase("bin-garbage", _bin(_garbage, "not a PyTorch checkpoint the safe unpickler accepts"),
               CheckpointFormatError),
    CorpusCase("bin-truncated", _bin(_truncated_zip, "PyTorch checkpoint"), CheckpointFormatError),
    CorpusCase("bin-not-a-mapping", _bin(_a_list, "expected a state dict", "found list"), CheckpointFormatError),
    CorpusCase("bin-nested-state-dict", _bin(_nested, "entry 'state_dict' is a dict, expected a tensor"),
               CheckpointFormatError),
    CorpusCase("bin-index-parent-path", _index_outside, CheckpointFormatError),
    CorpusCase("bin-storage-record-short", _bin(_short_storage_record, "storage record 'pytorch_model/data/",
                                                "holds 8188 bytes", "needs 8192"), CheckpointFormatError),
    CorpusCase("bin-zip-record-twice", _bin(_rebuilt({}, ("data.pkl", b"\x80\x02N.")),
                                            "zip record 'pytorch_model/data.pkl' appears twice"),
               CheckpointFormatError),
    CorpusCase("bin-zip-bzip2-record", _bin(_rebuilt({"data/3": zipfile.ZIP_BZIP2}),
                                            "zip record 'pytorch_model/data/3' uses compression method 12"),
               CheckpointFormatError),
    CorpusCase("bin-zip-no-version", _bin(_rebuilt({"version": None}),
                                          "has no 'pytorch_model/version' record"), CheckpointFormatError),
    CorpusCase("bin-zip-storage-missing", _bin(_rebuilt({"data/5": None}), "names storage '5'",
                                               "no record 'pytorch_model/data/5'"), CheckpointFormatError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_hostile_or_broken_bin_is_refused(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


@pytest.mark.parametrize("layout", PICKLE_LAYOUTS)
def test_the_hostile_pickle_really_runs_code_when_loaded_unsafely(tmp_path: Path, layout: str) -> None:
    """The refusal tests mean something: an unsafe load of the same bytes creates the marker."""
    marker = tmp_path / "pwned"
    path = write_code_running_pickle(tmp_path / BIN, marker, layout=layout)
    if layout == "bare":
        with path.open("rb") as fh:
            pickle.load(fh)  # proving the payload is live is the point
    else:
        torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("layout", PICKLE_LAYOUTS)
def test_refusal_names_the_global_without_advising_to_turn_safety_off(tmp_path: Path, layout: str) -> None:
    """torch's own advice (re-run with ``weights_only=False``, allow-list the global) must not reach users."""
    error = assert_load_refused(CorpusCase(f"bin-runs-code-{layout}", _hostile(layout), CheckpointFormatError),
                                tmp_path)
    message = str(error)
    assert "unsupported global exec" in message
    assert "weights_only" not in message and "safe_globals" not in message
    assert len(message) < 300 + len(str(tmp_path)), message


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_repacked_bin_loads_the_same_model(tmp_path: Path, compression: int) -> None:
    """A ``torch.save`` archive repacked by a zip tool loads the same weights (it used to load NaN logits)."""
    import loader

    saved, model = tmp_path / "saved", tmp_path / "model"
    write_config(saved)
    torch.save(llama_tensors(), saved / BIN)
    write_config(model)
    repack_zip(saved / BIN, model / BIN, compression=compression)
    expected = loader.load_model(str(saved), dtype="float32").state_dict()
    loaded = loader.load_model(str(model), dtype="float32").state_dict()
    assert set(loaded) == set(expected)
    for name, values in expected.items():
        assert torch.equal(loaded[name], values), name
