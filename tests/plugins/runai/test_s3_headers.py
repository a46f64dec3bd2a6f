"""A malformed safetensors header on ``s3://`` is refused as the local reader refuses it, for load and inspect.

The tensors of a safetensors file must cover its data exactly: no overlaps, no
gaps, nothing past the end, no trailing bytes. Each damaged checkpoint is
uploaded to the moto server; ``load_model`` and ``loader inspect`` on the
prefix must fail with the message the local path gives (the one parser), naming
the object, before any tensor is streamed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import loader
from loader._cli.inspect_cmd import inspect_source
from loader.errors import CheckpointFormatError
from tests.helpers.malformed import read_raw_safetensors, write_llama_checkpoint, write_raw_safetensors
from tests.helpers.s3_server import CountingMotoServer, upload_folder

SHARD = "model-00002-of-00002.safetensors"


def _last_two(header: dict[str, Any]) -> tuple[str, str]:
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"])
    return names[-2], names[-1]


def _shift_last(header: dict[str, Any], by: int) -> None:
    _, last = _last_two(header)
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [begin + by, end + by]


def _overlap(path: Path) -> None:
    header, data = read_raw_safetensors(path)
    _shift_last(header, -4)
    write_raw_safetensors(path, header, data[:-4])


def _gap(path: Path) -> None:
    header, data = read_raw_safetensors(path)
    _, last = _last_two(header)
    begin, _ = header[last]["data_offsets"]
    _shift_last(header, 4)
    write_raw_safetensors(path, header, data[:begin] + bytes(4) + data[begin:])


def _past_the_end(path: Path) -> None:
    header, data = read_raw_safetensors(path)
    _shift_last(header, 4)
    write_raw_safetensors(path, header, data)


def _trailing_bytes(path: Path) -> None:
    header, data = read_raw_safetensors(path)
    write_raw_safetensors(path, header, data + bytes(4))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "overlap": (_overlap, "overlap"),
    "gap": (_gap, "a gap of 4 bytes; safetensors requires the tensors to follow one another"),
    "past_the_end": (_past_the_end, "run past the end of the data"),
    "trailing_bytes": (_trailing_bytes, "safetensors requires the data to be fully covered"),
}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """A two-shard checkpoint whose second shard's header is damaged one way; the message expected."""
    damage, expected = DAMAGE[request.param]
    folder = tmp_path / "ckpt"
    write_llama_checkpoint(folder, shards=2)
    damage(folder / SHARD)
    return folder, expected


def _uploaded(folder: Path, client: Any, bucket: str) -> str:
    upload_folder(client, folder, bucket, "m")
    return f"s3://{bucket}/m"


def test_local_inspect_refuses_the_damage(damaged: tuple[Path, str]) -> None:
    """The reference: what the local reader says about the same file."""
    folder, expected = damaged
    with pytest.raises(CheckpointFormatError, match=expected):
        inspect_source(str(folder))


def test_s3_inspect_refuses_the_damage(damaged: tuple[Path, str], s3_client: Any, bucket: str,
                                       s3_env: CountingMotoServer) -> None:
    folder, expected = damaged
    uri = _uploaded(folder, s3_client, bucket)
    with pytest.raises(CheckpointFormatError, match=expected) as caught:
        inspect_source(uri)
    assert f"{uri}/{SHARD}: " in str(caught.value)


def test_s3_load_refuses_the_damage_before_streaming(damaged: tuple[Path, str], s3_client: Any, bucket: str,
                                                     s3_env: CountingMotoServer) -> None:
    folder, expected = damaged
    uri = _uploaded(folder, s3_client, bucket)
    s3_env.reset_counts()
    with pytest.raises(CheckpointFormatError, match=expected) as caught:
        loader.load_model(uri, dtype="float32")
    assert f"{uri}/{SHARD}: " in str(caught.value)
    shard_bytes = (folder / SHARD).stat().st_size
    served = s3_env.bytes_served[f"{bucket}/m/{SHARD}"]
    assert served < shard_bytes / 2, (served, shard_bytes)  # its header only, not its tensors


def test_local_runai_load_refuses_the_damage(damaged: tuple[Path, str]) -> None:
    folder, expected = damaged
    with pytest.raises(CheckpointFormatError, match=expected):
        loader.load_model(str(folder), dtype="float32", load_format="runai_streamer")
