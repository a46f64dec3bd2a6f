"""``loader inspect`` of a Hub id reads the side files and each shard's header, never a whole weight file.

The Hub is a local server (:mod:`tests.helpers.hub_server`) answering the requests
``huggingface_hub`` makes, serving a checkpoint ``transformers``' ``save_pretrained``
wrote in several shards with an index. Nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loader._cli.inspect_cmd import inspect_source
from loader.errors import CheckpointFormatError, SourceNotFoundError
from tests.helpers.hf_checkpoints import save_checkpoint
from tests.helpers.hub_cache import write_hub_cache
from tests.helpers.hub_server import ServedHub, point_huggingface_hub_at, served_hub
from tests.helpers.malformed import data_start

REPO = "acme/tiny-llama"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hub") / "ckpt"
    save_checkpoint("llama", path)
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def hub(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServedHub]:
    with served_hub(REPO, _files(checkpoint)) as served:
        point_huggingface_hub_at(served.endpoint, tmp_path / "cache", monkeypatch)
        yield served


def _without_location(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in ("source", "files")}


def test_inspect_fetches_headers_only_and_matches_local_inspect(checkpoint: Path, hub: ServedHub) -> None:
    shards = sorted(p for p in checkpoint.glob("*.safetensors"))
    assert len(shards) > 1 and (checkpoint / "model.safetensors.index.json").is_file()
    info = inspect_source(REPO)
    local = inspect_source(str(checkpoint))
    assert _without_location(info) == _without_location(local)
    assert [f.rsplit("/", 1)[1] for f in info["files"]] == [Path(f).name for f in local["files"]]
    for shard in shards:
        # exactly the 8-byte length and the JSON header, in two ranged GETs, and no HEAD
        assert hub.bytes_served[shard.name] == data_start(shard), shard.name
        assert hub.requests[("GET", shard.name)] == 2, shard.name
        assert hub.requests[("HEAD", shard.name)] == 0, shard.name
    weights = sum(hub.bytes_served[s.name] for s in shards)
    assert weights < 0.05 * sum(s.stat().st_size for s in shards)


def test_index_decides_which_shards_are_read(checkpoint: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(checkpoint)
    files["stray.safetensors"] = b"not read: the index does not name it"
    with served_hub(REPO, files) as served:
        point_huggingface_hub_at(served.endpoint, tmp_path / "cache", monkeypatch)
        info = inspect_source(REPO)
    assert not any(f.endswith("stray.safetensors") for f in info["files"])
    assert served.requests[("GET", "stray.safetensors")] == 0


def test_a_malformed_header_is_refused_as_locally(checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(checkpoint)
    shard = sorted(n for n in files if n.endswith(".safetensors"))[-1]
    files[shard] += bytes(4)  # trailing bytes no tensor covers
    local = tmp_path / "local"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
    with pytest.raises(CheckpointFormatError, match="fully covered") as local_error:
        inspect_source(str(local))
    with served_hub(REPO, files) as served:
        point_huggingface_hub_at(served.endpoint, tmp_path / "cache", monkeypatch)
        with pytest.raises(CheckpointFormatError) as remote_error:
            inspect_source(REPO)
    url_prefix = f"{served.endpoint}/{REPO}/resolve/"
    assert str(remote_error.value).startswith(url_prefix) and f"/{shard}: " in str(remote_error.value)
    assert str(remote_error.value).split(": ", 1)[1] == str(local_error.value).split(": ", 1)[1]


def test_a_server_ignoring_ranges_is_refused_before_the_body_is_read(checkpoint: Path, hub: ServedHub) -> None:
    hub.honour_ranges = False
    with pytest.raises(SourceNotFoundError, match=r"ignored the Range request \(status 200\)"):
        inspect_source(REPO)


def test_a_shard_gone_after_the_listing_is_one_line_naming_it(checkpoint: Path, hub: ServedHub) -> None:
    shard = sorted(n for n in hub.files if n.endswith(".safetensors"))[0]
    hub.gone.add(shard)
    with pytest.raises(SourceNotFoundError) as caught:
        inspect_source(REPO)
    message = str(caught.value)
    assert message.startswith(f"{hub.endpoint}/{REPO}/resolve/")
    assert f"/{shard}: the Hugging Face Hub request failed (RemoteEntryNotFoundError: 404 " in message
    assert "\n" not in message


def _hub_offline(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


def test_offline_inspect_reads_the_cached_snapshot(checkpoint: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``HF_HUB_OFFLINE=1``: a lookup in the local cache, as documented, with the same answer."""
    snapshot = write_hub_cache(tmp_path / "cache", REPO, _files(checkpoint))
    _hub_offline(tmp_path / "cache", monkeypatch)
    info = inspect_source(REPO)
    assert info["source"] == str(snapshot)
    assert _without_location(info) == _without_location(inspect_source(str(checkpoint)))


def test_offline_inspect_of_an_uncached_repository_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hub_offline(tmp_path / "cache", monkeypatch)
    with pytest.raises(SourceNotFoundError, match=r"not in the Hugging Face cache \(HF_HUB_OFFLINE is set\)"):
        inspect_source(REPO)


def test_unreachable_hub_inspects_the_cached_snapshot(checkpoint: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's port closed: the cached repository is used, as for a load."""
    snapshot = write_hub_cache(tmp_path / "cache", REPO, _files(checkpoint))
    with served_hub(REPO, {}) as gone:
        endpoint = gone.endpoint
    point_huggingface_hub_at(endpoint, tmp_path / "cache", monkeypatch)
    info = inspect_source(REPO)
    assert info["source"] == str(snapshot)
    assert info["tensors"] == inspect_source(str(checkpoint))["tensors"]


def test_a_pytorch_bin_repository_is_not_inspected_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only safetensors headers can be read alone; other repositories take the snapshot path."""
    from loader._sources.hub_files import hub_header_source

    files = {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
             "pytorch_model.bin": b"x"}
    with served_hub(REPO, files) as served:
        point_huggingface_hub_at(served.endpoint, tmp_path / "cache", monkeypatch)
        assert hub_header_source(REPO, None, "auto") is None
        assert hub_header_source(REPO, None, "gguf") is None
