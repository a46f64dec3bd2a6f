"""Whole loads whose CPU parameters are mapped from the safetensors files: same values as copying, byte for byte.

The tiny checkpoints have no tensor of 1 MiB, so ``LOADER_MAP_MIN_BYTES`` is
lowered to map every tensor of 4 KiB or more.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

import loader
from loader import _distributed as distributed
from loader._mapped_parameters import is_file_backed
from loader._sharded.save import save_sharded
from tests.helpers.hf_checkpoints import save_checkpoint, tiny_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mapping is Linux-only")


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-bf16")
    # hidden 128: rows of 256 bytes, so narrowed and fused parts stay congruent to their files
    save_checkpoint("llama", path, config=tiny_config("llama", hidden_size=128, intermediate_size=256),
                    dtype=torch.bfloat16, max_shard_size="200KB")
    return path


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, *, mapped: bool, **kwargs: object
          ) -> tuple[torch.nn.Module, loader.LoadReport]:
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "1" if mapped else "0")
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")
    return loader.load_model_with_report(str(path), **kwargs)  # type: ignore[arg-type]


def _file_tensors(path: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                found[name] = handle.get_tensor(name)
    return found


_FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"),
          "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def _expected(name: str, files: dict[str, torch.Tensor]) -> torch.Tensor:
    """What parameter ``name`` must hold: the file's tensor, or the file's parts stacked for a fused one."""
    for fused, parts in _FUSED.items():
        if name.endswith(fused):
            prefix = name[: -len(fused)]
            return torch.cat([files[prefix + part] for part in parts])
    return files[name if name in files else "model.embed_tokens.weight"]  # a tied lm_head


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_every_parameter_equals_the_files_values_in_the_target_dtype(bf16_llama: Path, dtype: torch.dtype,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model, report = _load(bf16_llama, monkeypatch, mapped=True, dtype=str(dtype).removeprefix("torch."))
    files = _file_tensors(bf16_llama)

    assert (report.bytes_mapped > 0) == (dtype == torch.bfloat16)
    for name, param in model.named_parameters():
        assert param.dtype == dtype
        assert torch.equal(param, _expected(name, files).to(dtype)), name


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    left, right = a.state_dict(), b.state_dict()
    assert left.keys() == right.keys()
    for name, value in left.items():
        assert torch.equal(value, right[name]), name


def test_mapped_parameters_hold_the_files_bytes(bf16_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, report = _load(bf16_llama, monkeypatch, mapped=True, dtype="bfloat16")
    files = _file_tensors(bf16_llama)
    params = dict(model.named_parameters())

    assert report.bytes_mapped > 0.8 * report.bytes_read  # the rest: norms, pages shared by fused parts
    layer = "model.layers.1"
    qkv = params[f"{layer}.self_attn.qkv_proj.weight"]
    assert is_file_backed(qkv)
    expected_qkv = torch.cat([files[f"{layer}.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv, expected_qkv)
    gate_up = torch.cat([files[f"{layer}.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(params[f"{layer}.mlp.gate_up_proj.weight"], gate_up)
    for name in ("model.embed_tokens.weight", f"{layer}.self_attn.o_proj.weight", f"{layer}.mlp.down_proj.weight"):
        assert torch.equal(params[name], files[name]), name


def test_mapped_and_copied_loads_agree_and_generate_the_same(bf16_llama: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    mapped, mapped_report = _load(bf16_llama, monkeypatch, mapped=True, dtype="bfloat16")
    copied, copied_report = _load(bf16_llama, monkeypatch, mapped=False, dtype="bfloat16")

    _same_state(mapped, copied)
    assert copied_report.bytes_mapped == 0
    assert mapped_report.bytes_read == copied_report.bytes_read
    ids = torch.tensor([[1, 5, 9, 2]])
    assert torch.equal(mapped(ids), copied(ids))


def test_another_dtype_is_converted_not_mapped(bf16_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, report = _load(bf16_llama, monkeypatch, mapped=True, dtype="float32")
    files = _file_tensors(bf16_llama)

    assert report.bytes_mapped == 0
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(dict(model.named_parameters())[name], files[name].to(torch.float32))


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_maps_its_own_rows(bf16_llama: Path, monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    with distributed.simulated_tp(rank, 2):
        mapped, mapped_report = _load(bf16_llama, monkeypatch, mapped=True, dtype="bfloat16")
        copied, copied_report = _load(bf16_llama, monkeypatch, mapped=False, dtype="bfloat16")

    _same_state(mapped, copied)
    assert 0 < mapped_report.bytes_mapped < mapped_report.bytes_read  # row-parallel halves are strided: read
    assert mapped_report.bytes_read == copied_report.bytes_read


def test_sharded_state_is_mapped_whole(bf16_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_sharded(str(bf16_llama), tmp_path / "tp1", tp_size=1, dtype="bfloat16")
    sharded, report = _load(tmp_path / "tp1", monkeypatch, mapped=True, dtype="bfloat16")
    copied, _ = _load(bf16_llama, monkeypatch, mapped=False, dtype="bfloat16")

    assert report.load_format == "sharded_state"
    assert report.bytes_mapped > 0.8 * report.bytes_read  # the rest: norms, pages shared by fused parts
    _same_state(sharded, copied)


def test_load_json_reports_the_mapped_bytes(bf16_llama: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from loader._cli.main import main

    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")
    assert main(["load", str(bf16_llama), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0.8 * report["bytes_read"] < report["bytes_mapped"] <= report["bytes_read"]

    assert main(["load", str(bf16_llama)]) == 0
    assert "page cache pages, not copied" in capsys.readouterr().out


# --- mixture of experts: every expert's part lands in a slice of a 3-D parameter ------------------------------

PAGE = 4096


def _save_page_aligned(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file whose data starts on a page (the header padded through its metadata)."""
    pad = 0
    while True:
        blob = save(tensors, metadata={"format": "pt", "pad": "x" * pad})
        start = 8 + int.from_bytes(blob[:8], "little")
        if start % PAGE == 0:
            path.write_bytes(blob)
            return
        pad += (-start) % PAGE if pad == 0 else 1


@pytest.fixture(scope="module")
def aligned_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE in bf16 whose experts sit in a file of their own, each part one whole page."""
    written = tmp_path_factory.mktemp("qwen3-moe-written")
    save_checkpoint("qwen3_moe", written, dtype=torch.bfloat16)  # experts of 32 x 64: 4 KiB a part
    path = tmp_path_factory.mktemp("qwen3-moe-aligned")
    tensors = _file_tensors(written)
    files = {name: "experts.safetensors" if ".mlp.experts." in name else "rest.safetensors" for name in tensors}
    _save_page_aligned({n: t for n, t in tensors.items() if files[n] == "experts.safetensors"},
                       path / "experts.safetensors")
    save_file({n: t for n, t in tensors.items() if files[n] == "rest.safetensors"}, str(path / "rest.safetensors"),
              metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
    shutil.copy(written / "config.json", path / "config.json")
    return path


def _expert_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if n.endswith(("w13_weight", "w2_weight"))}


def test_every_expert_part_is_mapped(aligned_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mapped, report = _load(aligned_moe, monkeypatch, mapped=True, dtype="bfloat16")
    copied, copied_report = _load(aligned_moe, monkeypatch, mapped=False, dtype="bfloat16")
    experts = _expert_params(mapped)
    expert_bytes = sum(p.numel() * p.element_size() for p in experts.values())

    assert experts and all(is_file_backed(p) for p in experts.values())
    assert report.bytes_mapped >= expert_bytes
    assert copied_report.bytes_mapped == 0
    _same_state(mapped, copied)
    files = _file_tensors(aligned_moe)
    w13 = experts["model.layers.1.mlp.experts.w13_weight"]
    assert torch.equal(w13[3], torch.cat([files[f"model.layers.1.mlp.experts.3.{p}_proj.weight"]
                                          for p in ("gate", "up")]))


def test_writing_a_mapped_expert_leaves_the_file_alone(aligned_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = hashlib.sha256((aligned_moe / "experts.safetensors").read_bytes()).hexdigest()
    model, _ = _load(aligned_moe, monkeypatch, mapped=True, dtype="bfloat16")
    w13 = _expert_params(model)["model.layers.0.mlp.experts.w13_weight"]
    assert is_file_backed(w13)

    with torch.no_grad():
        w13[2].fill_(7.0)

    assert bool((w13[2] == 7.0).all())
    assert hashlib.sha256((aligned_moe / "experts.safetensors").read_bytes()).hexdigest() == before
    fresh, _ = _load(aligned_moe, monkeypatch, mapped=True, dtype="bfloat16")
    assert not bool((_expert_params(fresh)["model.layers.0.mlp.experts.w13_weight"][2] == 7.0).all())


@pytest.mark.parametrize("rank", [0, 1])
def test_each_expert_parallel_rank_maps_its_own_experts(aligned_moe: Path, monkeypatch: pytest.MonkeyPatch,
                                                        rank: int) -> None:
    with distributed.simulated_tp(rank, 2):
        mapped, report = _load(aligned_moe, monkeypatch, mapped=True, dtype="bfloat16", enable_expert_parallel=True)
        copied, _ = _load(aligned_moe, monkeypatch, mapped=False, dtype="bfloat16", enable_expert_parallel=True)

    _same_state(mapped, copied)
    experts = _expert_params(mapped)
    assert experts["model.layers.0.mlp.experts.w13_weight"].shape[0] == 2, "two of the four experts"
    assert all(is_file_backed(p) for p in experts.values())
    assert report.bytes_mapped >= sum(p.numel() * p.element_size() for p in experts.values())


# --- a fused parameter whose parts lie at different page phases in the file ------------------------------------


def _file_pages(address: int, length: int) -> set[str]:
    """The files ``/proc/self/maps`` shows behind the whole pages of ``[address, address + length)``."""
    first, last = -(-address // PAGE) * PAGE, (address + length) // PAGE * PAGE
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start < last and first < end:
            found.add(fields[5] if len(fields) > 5 else "")
    return found


def test_the_largest_part_of_a_fused_parameter_decides_what_is_mapped(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3 stores a 64-byte ``q_norm`` between ``o_proj`` and ``q_proj``: ``k`` (first in the file) and ``q``
    cannot both be congruent with one placement of ``qkv_proj``. The region is placed for ``q`` (the largest
    part), so ``q`` and ``v`` are the file's pages and only the small ``k`` is copied."""
    save_checkpoint("qwen3", tmp_path, config=tiny_config("qwen3", hidden_size=128, head_dim=64),
                    dtype=torch.bfloat16, max_shard_size="10MB")
    model, _ = _load(tmp_path, monkeypatch, mapped=True, dtype="bfloat16")
    copied, _ = _load(tmp_path, monkeypatch, mapped=False, dtype="bfloat16")
    _same_state(model, copied)
    qkv = model.model.layers[1].self_attn.qkv_proj
    rows = qkv.weight
    row_bytes = rows.shape[1] * rows.element_size()
    files = {str(f.resolve()) for f in tmp_path.glob("*.safetensors")}
    q_bytes = qkv.q_size * row_bytes
    assert _file_pages(rows.data_ptr(), q_bytes) & files  # q mapped
    v_start = rows.data_ptr() + (qkv.q_size + qkv.kv_size) * row_bytes
    assert _file_pages(v_start, qkv.kv_size * row_bytes) & files  # v, congruent with q, mapped
