"""The load's progress bar counts bytes, shows the total and the rate, and stays silent for fast loads."""

from __future__ import annotations

import time

import pytest
import torch

from loader._pipeline.progress import checkpoint_size, with_progress
from loader.weights import EagerTensor


def _stream(count: int, pause: float):
    for i in range(count):
        time.sleep(pause)
        yield f"t{i}", EagerTensor(torch.zeros(256, dtype=torch.float32))  # 1 KiB each


def test_slow_load_shows_bytes_total_and_rate(capsys: pytest.CaptureFixture[str]) -> None:
    names = [name for name, _ in with_progress(_stream(6, 0.25), True, total=6 * 1024)]
    assert names == [f"t{i}" for i in range(6)]
    shown = capsys.readouterr().err
    assert "loading" in shown
    assert "B/6.00kB [" in shown  # done / total, in bytes
    assert "B/s]" in shown  # the rate


def test_fast_load_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(list(with_progress(_stream(6, 0.0), True, total=6 * 1024))) == 6
    assert capsys.readouterr().err == ""


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(list(with_progress(_stream(6, 0.25), False, total=None))) == 6
    assert capsys.readouterr().err == ""


def test_checkpoint_size(tmp_path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 5)
    assert checkpoint_size([str(tmp_path / "a"), str(tmp_path / "b")]) == 15
    assert checkpoint_size([str(tmp_path / "a"), "s3://bucket/model.safetensors"]) is None
