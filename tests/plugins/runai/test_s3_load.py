"""``s3://`` checkpoints load through the streamer with the same parameters and logits as the local load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader._cli.inspect_cmd import inspect_source
from loader.errors import ConfigError
from tests.helpers.s3_server import CountingMotoServer, upload_folder


def _assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    ids = torch.tensor([[1, 5, 9, 200, 3, 7]])
    assert torch.equal(a(ids), b(ids))


def test_sharded_checkpoint_with_index_loads_bit_equal(
    llama_checkpoint: Path, s3_client: Any, bucket: str, s3_env: CountingMotoServer
) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "models/llama")
    shards = sorted(p.name for p in llama_checkpoint.glob("*.safetensors"))
    assert len(shards) > 2
    model, report = loader.load_model_with_report(f"s3://{bucket}/models/llama", dtype="float32")
    local = loader.load_model(str(llama_checkpoint), dtype="float32")
    _assert_same_model(model, local)
    assert report.load_format == "runai_streamer"
    assert [f.rsplit("/", 1)[1] for f in report.files] == shards
    served = sum(n for key, n in s3_env.bytes_served.items() if key.endswith(".safetensors"))
    assert report.bytes_read == report.checkpoint_bytes
    assert report.bytes_read <= served  # the streamer's header reads come on top
    assert report.gb_per_second > 0


def test_trailing_slash_and_bf16_load(llama_checkpoint: Path, s3_client: Any, bucket: str, s3_env: Any) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    model = loader.load_model(f"s3://{bucket}/m/", dtype="bfloat16")
    local = loader.load_model(str(llama_checkpoint), dtype="bfloat16")
    _assert_same_model(model, local)


def test_index_keeps_only_the_shards_it_names(
    llama_checkpoint: Path, tmp_path: Path, s3_client: Any, bucket: str, s3_env: CountingMotoServer
) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_client.put_object(Bucket=bucket, Key="m/consolidated.safetensors", Body=b"not a weight file at all")
    model, report = loader.load_model_with_report(f"s3://{bucket}/m", dtype="float32")
    assert not any("consolidated" in f for f in report.files)
    assert s3_env.bytes_served[f"{bucket}/m/consolidated.safetensors"] == 0
    _assert_same_model(model, loader.load_model(str(llama_checkpoint), dtype="float32"))


def test_index_naming_a_missing_shard_is_refused(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                  s3_env: Any) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    index = json.loads((llama_checkpoint / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra.weight"] = "model-99999-of-99999.safetensors"
    s3_client.put_object(Bucket=bucket, Key="m/model.safetensors.index.json", Body=json.dumps(index).encode())
    with pytest.raises(loader.LoadError, match=rf"s3://{bucket}/m/model.safetensors.index.json: the index names "
                                               r"shard\(s\) the runai_streamer format did not list: model-99999"):
        loader.load_model(f"s3://{bucket}/m")


def test_index_pointing_outside_the_prefix_is_refused(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                       s3_env: Any) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    index = {"weight_map": {"model.norm.weight": "../other/model.safetensors"}}
    s3_client.put_object(Bucket=bucket, Key="m/model.safetensors.index.json", Body=json.dumps(index).encode())
    with pytest.raises(loader.LoadError, match=r"points outside the model folder"):
        loader.load_model(f"s3://{bucket}/m")


def test_missing_config_is_a_config_error(llama_checkpoint: Path, s3_client: Any, bucket: str, s3_env: Any) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_client.delete_object(Bucket=bucket, Key="m/config.json")
    with pytest.raises(ConfigError, match="no config.json"):
        loader.load_model(f"s3://{bucket}/m")


def test_config_that_is_not_json_names_the_object(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                   s3_env: Any) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_client.put_object(Bucket=bucket, Key="m/config.json", Body=b"{not json")
    with pytest.raises(ConfigError, match=rf"s3://{bucket}/m/config.json: config.json is not valid JSON"):
        loader.load_model(f"s3://{bucket}/m")


def test_inspect_reads_headers_only(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                    s3_env: CountingMotoServer) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_env.reset_counts()
    info = inspect_source(f"s3://{bucket}/m")
    local = inspect_source(str(llama_checkpoint))
    assert info["format"] == "runai_streamer"
    assert info["tensors"] == local["tensors"] and info["bytes"] == local["bytes"]
    assert info["dtypes"] == local["dtypes"]
    served = sum(n for key, n in s3_env.bytes_served.items() if key.endswith(".safetensors"))
    assert served < 0.2 * local["bytes"], (served, local["bytes"])
