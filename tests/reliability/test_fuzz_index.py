"""Fuzzing the weight index: any ``weight_map`` is applied or refused with a LoadError, never escapes the folder.

:func:`loader._pipeline.prepare.filter_weight_files` reads the index and keeps
the shards it names. The harness writes an index whose ``weight_map`` holds
hostile file names (traversal, absolute paths, NUL bytes, names too long for
the file system, a symlink out of the folder, sub-folders, non-strings) next to
real shards, and checks that every file kept lies inside the model folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loader._pipeline.prepare import filter_weight_files
from loader.checkpoint import Source, WeightFormat
from loader.errors import LoadError
from tests.reliability.conftest import FUZZ_PROFILE
from tests.reliability.fuzz_values import json_values, path_like_names

FUZZ = settings(parent=settings.get_profile(FUZZ_PROFILE))
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-index")
    folder = root / "model"
    folder.mkdir()
    for shard in SHARDS:
        (folder / shard).write_bytes(b"\0" * 16)
    (root / "outside.safetensors").write_bytes(b"\0" * 16)
    (folder / "link.safetensors").symlink_to(root / "outside.safetensors")
    (folder / "dir").mkdir()
    (folder / "sub").mkdir()
    return folder


weight_maps = st.one_of(
    st.dictionaries(st.text(max_size=8), path_like_names() | json_values(2), max_size=6),
    json_values(4),
)
index_documents = st.one_of(
    st.fixed_dictionaries({"weight_map": weight_maps}, optional={"metadata": json_values(3)}),
    json_values(4),
)


@FUZZ
@given(index_documents)
def test_any_index_is_applied_inside_the_folder_or_refused(model_folder: Path, document: Any) -> None:
    index = model_folder / "model.safetensors.index.json"
    index.write_text(json.dumps(document))
    files = tuple(str(model_folder / name) for name in (*SHARDS, "link.safetensors"))
    weight_format = WeightFormat("safetensors", files, index=str(index))
    try:
        kept = filter_weight_files(Source(str(model_folder), model_folder), weight_format)
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(index) in str(exc) or str(model_folder) in str(exc)
        return
    event("accepted")
    root = model_folder.resolve()
    for file in kept.files:
        assert file in files
        real = Path(os.path.realpath(file))
        assert root in real.parents, f"kept {file}, which resolves outside the model folder"
