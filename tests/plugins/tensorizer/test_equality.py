"""Acceptance at tp=1: logits equal the safetensors load bit for bit, fp32 and bf16, tiny Llama and tied Qwen2,
for files tensorizer's own serializer wrote and files ``save_tensorized`` wrote, plain and encrypted, read
locally, from moto ``s3://`` and from a local HTTP server."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader
from tests.helpers.model_checks import random_ids
from tests.plugins.tensorizer.conftest import DTYPES, FAMILIES

CASES = [(family, dtype) for family in FAMILIES for dtype in DTYPES]
_REFERENCE: dict[tuple[str, str], torch.Tensor] = {}


def _logits(location: str, dtype: str, **options: str) -> torch.Tensor:
    model, report = loader.load_model_with_report(location, dtype=dtype, format_options=options or None)
    assert report.load_format == "tensorizer"
    with torch.no_grad():
        return model(random_ids(256))


def _reference(checkpoints: dict[str, Path], family: str, dtype: str) -> torch.Tensor:
    if (family, dtype) not in _REFERENCE:
        with torch.no_grad():
            _REFERENCE[family, dtype] = loader.load_model(str(checkpoints[f"{family}-{dtype}-st"]), dtype=dtype)(
                random_ids(256))
    return _REFERENCE[family, dtype]


@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_local_files_equal_the_safetensors_load(checkpoints: dict[str, Path], family: str, dtype: str) -> None:
    expected = _reference(checkpoints, family, dtype)
    key = str(checkpoints["key"])
    name = f"{family}-{dtype}"
    assert torch.equal(_logits(str(checkpoints[f"{name}-tz"]), dtype), expected)
    assert torch.equal(_logits(str(checkpoints[f"{name}-tz"] / "model.tensors"), dtype), expected)
    assert torch.equal(_logits(str(checkpoints[f"{name}-tz-enc"]), dtype, encryption_keyfile=key), expected)
    assert torch.equal(_logits(str(checkpoints[f"{name}-w1"]), dtype), expected)
    assert torch.equal(_logits(str(checkpoints[f"{name}-w1-enc"]), dtype, encryption_keyfile=key), expected)
    # vLLM's spelling: config from SOURCE, tensors from tensorizer_uri
    uri = str(checkpoints[f"{name}-tz"] / "model.tensors")
    assert torch.equal(_logits(str(checkpoints[f"{name}-st"]), dtype, tensorizer_uri=uri), expected)


@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_s3_files_equal_the_safetensors_load(checkpoints: dict[str, Path], s3_env: str, family: str,
                                             dtype: str) -> None:
    expected = _reference(checkpoints, family, dtype)
    key = str(checkpoints["key"])
    name = f"{family}-{dtype}"
    assert torch.equal(_logits(f"s3://{s3_env}/{name}-tz/model.tensors", dtype), expected)
    assert torch.equal(_logits(f"s3://{s3_env}/{name}-tz-enc/model.tensors", dtype, encryption_keyfile=key),
                       expected)
    assert torch.equal(_logits(f"s3://{s3_env}/{name}-w1-enc/model-rank-%03d.tensors", dtype,
                               encryption_keyfile=key), expected)
    with pytest.MonkeyPatch.context() as patch:  # a folder asked for by name
        patch.setattr(loader, "load_model_with_report", loader.load_model_with_report)
        model = loader.load_model(f"s3://{s3_env}/{name}-w1", dtype=dtype, load_format="tensorizer")
        with torch.no_grad():
            assert torch.equal(model(random_ids(256)), expected)


@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_http_files_equal_the_safetensors_load(checkpoints: dict[str, Path], http_root: str, family: str,
                                               dtype: str) -> None:
    expected = _reference(checkpoints, family, dtype)
    key = str(checkpoints["key"])
    name = f"{family}-{dtype}"
    assert torch.equal(_logits(f"{http_root}{name}-tz/model.tensors", dtype), expected)
    assert torch.equal(_logits(f"{http_root}{name}-tz-enc/model.tensors", dtype, encryption_keyfile=key), expected)
    assert torch.equal(_logits(f"{http_root}{name}-w1/model-rank-%03d.tensors", dtype), expected)
