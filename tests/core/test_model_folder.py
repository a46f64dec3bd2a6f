"""The model folder's boundary: files inside it, or in the same cache repository's blobs, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loader._hf_files import load_hf_tokenizer
from loader._model_folder import allowed_roots, require_inside
from loader.errors import CheckpointFormatError, ConfigError
from tests.helpers.hub_cache import repo_folder, write_hub_cache


def test_a_plain_folder_allows_only_itself(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "inner").write_bytes(b"x")
    (tmp_path / "model" / "link").symlink_to("inner")
    assert allowed_roots(tmp_path / "model") == ((tmp_path / "model").resolve(),)
    assert require_inside(tmp_path / "model" / "link", tmp_path / "model") == (tmp_path / "model" / "inner")


def test_a_snapshot_and_its_sub_folders_allow_their_repository_blobs(tmp_path: Path) -> None:
    snapshot = write_hub_cache(tmp_path, "acme/tiny", {"config.json": b"{}", "sub/weights.safetensors": b"w"})
    blobs = repo_folder(tmp_path, "acme/tiny") / "blobs"
    assert allowed_roots(snapshot) == (snapshot, blobs)
    assert allowed_roots(snapshot / "sub") == (snapshot / "sub", blobs)
    assert require_inside(snapshot / "sub" / "weights.safetensors", snapshot / "sub").parent == blobs


@pytest.mark.parametrize("target", ["/dev/zero", "../outside", "../../models--acme--other/blobs/abc",
                                    "../../blobs/../refs/main"])
def test_links_leaving_the_snapshot_and_its_blobs_are_refused(tmp_path: Path, target: str) -> None:
    snapshot = write_hub_cache(tmp_path, "acme/tiny", {"config.json": b"{}"})
    (snapshot / "model.safetensors").symlink_to(target)
    with pytest.raises(CheckpointFormatError, match=r"model\.safetensors resolves to .*, outside the model folder "
                                                    r".* and its Hugging Face cache blobs"):
        require_inside(snapshot / "model.safetensors", snapshot)


def test_a_symlink_loop_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(ConfigError, match=r"/a"):
        require_inside(tmp_path / "a", tmp_path, error=ConfigError)


def test_tokenizer_files_linking_out_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    os.symlink(tmp_path / "secret.json", model / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"tokenizer\.json resolves to .*secret\.json, outside the model folder"):
        load_hf_tokenizer(model)
