"""A plain remote ``.tensors`` file is read front to back through one ranged stream, straight into the
parameters: one GET per file and load (its index included), what lies behind the stream fetched by its own
range, a stream that breaks off named with the file and the offset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader
from loader.errors import LoadError
from loader.weights import ReadStats
from loader_plugin_tensorizer.options import TensorizerOptions
from loader_plugin_tensorizer.stream import iter_tensorized
from tests.helpers.s3_server import CountingMotoServer
from tests.plugins.tensorizer.http_server import RangeHTTPServer


def _expected(checkpoints: dict[str, Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = checkpoints["llama-float32-st"]
    return {k: v for f in folder.glob("*.safetensors") for k, v in load_file(f).items()}


def test_a_plain_s3_file_is_fetched_by_one_get(checkpoints: dict[str, Path], s3_server: CountingMotoServer,
                                               s3_env: str) -> None:
    key = f"{s3_env}/llama-float32-tz/model.tensors"
    s3_server.reset_counts()
    loader.load_model(f"s3://{key}", dtype="float32")
    assert s3_server.gets[key] == 1
    assert s3_server.bytes_served[key] == (checkpoints["llama-float32-tz"] / "model.tensors").stat().st_size


def test_tensors_read_out_of_order_are_fetched_by_their_own_range(checkpoints: dict[str, Path],
                                                                  http_root: str) -> None:
    expected = _expected(checkpoints)
    handles = list(iter_tensorized([f"{http_root}llama-float32-tz/model.tensors"], TensorizerOptions(),
                                   ReadStats()))
    for name, handle in reversed(handles):  # every read but the first lies behind the stream
        assert torch.equal(handle.read(), expected[name]), name
    rows = dict(handles)["model.embed_tokens.weight"].narrow(0, 128, 128)
    assert torch.equal(rows.read(), expected["model.embed_tokens.weight"][128:])


def test_a_stream_that_breaks_off_names_the_file_and_offset(checkpoints: dict[str, Path]) -> None:
    folder = checkpoints["llama-float32-tz"].parent
    server = RangeHTTPServer(folder, cut_after=300_000)
    server.start()
    try:
        with pytest.raises(LoadError, match=r"llama-float32-tz/model.tensors: the stream broke off at byte "
                                            r"\d+ of \d+"):
            loader.load_model(f"{server.url}llama-float32-tz/model.tensors", dtype="float32")
    finally:
        server.stop()


def test_num_readers_hands_a_plain_remote_file_to_the_deserializer(s3_server: CountingMotoServer,
                                                                   s3_env: str) -> None:
    from tests.helpers.model_checks import random_ids

    key = f"{s3_env}/llama-float32-tz/model.tensors"
    streamed = loader.load_model(f"s3://{key}", dtype="float32")
    s3_server.reset_counts()
    deserialized = loader.load_model(f"s3://{key}", dtype="float32", format_options={"num_readers": 2})
    assert s3_server.gets[key] > 1  # the index by ranged reads, then the deserializer's readers
    with torch.no_grad():
        assert torch.equal(streamed(random_ids(256)), deserialized(random_ids(256)))
