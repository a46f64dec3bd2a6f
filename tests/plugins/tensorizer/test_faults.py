"""Bad input, each with the message a user sees: truncated file, wrong or missing key, a tensor missing, a shape
that disagrees with the config, an unreachable endpoint (fast, one line), per-rank files for another TP size."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loader
from loader.errors import CheckpointFormatError, MissingWeightsError, ShapeMismatchError, UnsupportedError
from loader_plugin_tensorizer import DecryptionError, StorageAccessError
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.helpers.s3_server import free_port
from tests.plugins.tensorizer.conftest import write_tensorizer_folder


def test_a_truncated_file_names_the_tensor_past_its_end(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    shutil.copytree(checkpoints["llama-float32-tz"], folder)
    data = (folder / "model.tensors").read_bytes()
    (folder / "model.tensors").write_bytes(data[:-100])
    end = len(data) - 8  # the last tensor's end: an 8-byte end mark follows it
    with pytest.raises(CheckpointFormatError, match=r"model.tensors: truncated: tensor 'lm_head.weight' needs bytes "
                                                    rf"up to {end} but the file has {len(data) - 100}"):
        loader.load_model(str(folder), dtype="float32")


def test_a_file_cut_inside_its_index_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    shutil.copytree(checkpoints["llama-float32-tz"], folder)
    (folder / "model.tensors").write_bytes((folder / "model.tensors").read_bytes()[:200])
    with pytest.raises(CheckpointFormatError, match=r"truncated: the file ends inside its tensor index"):
        loader.load_model(str(folder), dtype="float32")


def test_a_wrong_key_fails_by_name(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    with pytest.raises(DecryptionError, match=rf"decryption failed with the key in {wrong} \(a key for another"):
        loader.load_model(str(checkpoints["llama-float32-w1-enc"]), dtype="float32",
                          format_options={"encryption_keyfile": str(wrong)})


def test_a_missing_key_fails_by_name(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(DecryptionError, match=r"model.tensors: is encrypted; pass its key file with the format "
                                              r"option encryption_keyfile=PATH"):
        loader.load_model(str(checkpoints["qwen2-float32-tz-enc"]), dtype="float32")


def test_a_key_file_of_the_wrong_length_is_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    with pytest.raises(UnsupportedError, match=r"short.key: an encryption key file holds 32 raw bytes, found 3"):
        loader.load_model(str(checkpoints["qwen2-float32-tz-enc"]), dtype="float32",
                          format_options={"encryption_keyfile": str(short)})


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    from tensorizer import TensorSerializer

    model = build_model("llama")
    folder = tmp_path / "m"
    folder.mkdir()
    model.config.save_pretrained(folder)
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight"}
    serializer = TensorSerializer(str(folder / "model.tensors"))
    serializer.write_state_dict(state)
    serializer.close()
    with pytest.raises(MissingWeightsError, match=r"model.layers.1.mlp.down_proj.weight"):
        loader.load_model(str(folder), dtype="float32")


def test_a_shape_that_disagrees_with_the_config_is_named(tmp_path: Path) -> None:
    model = build_model("llama", tiny_config("llama", intermediate_size=96))
    folder = write_tensorizer_folder(model, tmp_path / "m")
    tiny_config("llama").save_pretrained(folder)  # the config says 128
    with pytest.raises(ShapeMismatchError, match=r"tensor 'model.layers.0.mlp.(gate|up)_proj.weight' in .*"
                                                 r"model.tensors.*expected shape \(128, 64\).*found \(96, 64\)"):
        loader.load_model(str(folder), dtype="float32")


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_an_unreachable_endpoint_fails_fast_on_one_line(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    if scheme == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        location = "s3://bucket/m/model.tensors"
    else:
        location = f"http://127.0.0.1:{port}/m/model.tensors"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "loader._cli.main", "load", location], capture_output=True,
                          text=True, timeout=60)
    assert time.monotonic() - start < 15
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert f"127.0.0.1:{port}" in lines[0] and ("cannot reach" in lines[0] or "cannot read from S3" in lines[0])
    with pytest.raises(StorageAccessError):
        loader.load_model(location)


def test_per_rank_files_for_another_tp_size_are_refused(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(UnsupportedError, match=r"holds 2 per-rank tensorized file\(s\), written for tensor "
                                               r"parallel size 2, but this load runs with tensor parallel size 1"):
        loader.load_model(str(checkpoints["llama-float32-w2"]), dtype="float32")


def test_a_per_rank_set_with_a_file_missing_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "w2"
    shutil.copytree(checkpoints["llama-float32-w2"], folder)
    (folder / "model-rank-001.tensors").unlink()
    with pytest.raises(CheckpointFormatError, match=r"holds per-rank files for ranks \[0\] but tensorized.json says "
                                                    r"tensor parallel size 2"):
        loader.load_model(str(folder), dtype="float32")


def test_the_cli_names_a_tp_mismatch_on_one_line(checkpoints: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "loader._cli.main", "load", str(checkpoints["llama-float32-w2"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "-tp 1" in done.stderr


def test_an_unknown_format_option_is_named(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(UnsupportedError, match=r"unknown format option\(s\) 'readers' for tensorizer"):
        loader.load_model(str(checkpoints["llama-float32-tz"]), format_options={"readers": 4})


def test_save_tensorized_refuses_a_non_empty_output(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from loader_plugin_tensorizer import save_tensorized

    (tmp_path / "x").write_text("")
    with pytest.raises(UnsupportedError, match=r"output folder exists and is not empty"):
        save_tensorized(str(checkpoints["llama-float32-st"]), tmp_path, tp_size=1)
