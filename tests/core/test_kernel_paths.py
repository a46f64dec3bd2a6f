"""``loader.kernels``' path per activation dtype and tokens: buckets, the static rule, the chooser on injected
timings (a kernel missing on the layer, a bucket never timed), the timings cache on disk, every path's result
against the dequantized weight, and the report's per-bucket record."""

from __future__ import annotations

import json

import pytest
import torch

from loader.errors import SettingError
from loader.kernels import (
    MEASURE_MAX_WEIGHTS,
    PACKED_BF16_LOGITS_TOLERANCE,
    TOKEN_BUCKETS,
    KernelChoice,
    TokenPlan,
    available_paths,
    bucket_label,
    dequantize_tile_rows,
    kernel_timing,
    measure_rows,
    pack_int4,
    pack_int8,
    pack_int8_grouped,
    plan_from_timings,
    plan_weight_paths,
    run_path,
    run_planned,
    static_plan,
    token_bucket,
    weight_paths,
)
from loader.kernels.token_plan import MARGIN


def test_calls_fall_in_buckets_by_their_token_count():
    assert [token_bucket(m) for m in (1, 2, 16, 17, 37, 64, 65, 256, 257, 4096)] == [1, 8, 8, 32, 32, 32, 128,
                                                                                    128, 512, 512]
    assert [bucket_label(b) for b in TOKEN_BUCKETS] == ["1", "2-16", "17-64", "65-256", "257+"]


def test_the_static_rule_per_dtype_and_its_refusal():
    assert static_plan("bfloat16", ("packed", "dequantize")).paths == ("packed",) * 5
    assert static_plan("float32", ("packed-bf16", "dequantize")).paths == ("packed-bf16",) * 5
    assert static_plan("float32", ("packed", "dequantize", "dense"), exact=True).paths == ("dense",) * 5
    assert static_plan("float32", ("packed", "dequantize"), exact=True).paths == ("dequantize",) * 5
    with pytest.raises(ValueError, match=r"no path of \['packed'\] fits the static rule for float32 activations "
                                         r"\(\['packed-bf16', 'dequantize'\]\)"):
        static_plan("float32", ("packed",))


def test_the_chooser_takes_the_fastest_available_path_per_bucket_from_injected_timings():
    timings = {
        1: {"packed-bf16": 1e-4, "dequantize": 2e-3, "dense": 5e-5},
        8: {"packed-bf16": 2e-4, "dequantize": 2e-3},
        32: {"packed-bf16": 9e-4, "dequantize": 3e-3},
        128: {"packed-bf16": 5e-3, "dequantize": 4e-3},
        512: {"packed-bf16": 2e-2, "dequantize": 1e-2, "packed": 1e-9},  # packed: not this layer's
    }
    plan = plan_from_timings("float32", timings, ("packed-bf16", "dequantize"))
    assert plan == TokenPlan("float32", ("packed-bf16", "packed-bf16", "packed-bf16", "dequantize", "dequantize"),
                             "measured")
    # the dense copy was fastest at one token, but this layer keeps none: its timing is skipped
    assert plan_from_timings("float32", timings, ("packed-bf16", "dequantize", "dense")).paths[0] == "dense"
    assert plan.path_for(37) == "packed-bf16" and plan.path_for(300) == "dequantize"


def test_a_path_barely_faster_than_the_static_rule_s_does_not_replace_it():
    """Within the margin (timing noise on a shared machine) the static rule's path stands; beyond it, it goes;
    the dequantized twin replaces it whenever it is faster at all."""
    close = {b: {"packed": 1.0, "dense": 1.0 / (MARGIN - 0.02)} for b in TOKEN_BUCKETS}
    assert plan_from_timings("bfloat16", close, ("packed", "dense")).paths == ("packed",) * 5
    far = {b: {"packed": 1.0, "dense": 1.0 / (MARGIN + 0.02)} for b in TOKEN_BUCKETS}
    assert plan_from_timings("bfloat16", far, ("packed", "dense")).paths == ("dense",) * 5
    twin = {b: {"packed": 1.0, "dequantize": 0.99} for b in TOKEN_BUCKETS}
    assert plan_from_timings("bfloat16", twin, ("packed", "dequantize")).paths == ("dequantize",) * 5


def test_a_kernel_missing_on_the_layer_or_never_timed_falls_back_to_the_static_rule():
    """Timings of the packed kernel only, on a layer that cannot run it (its shape fell back): every bucket
    takes the static rule's path; a bucket with no timing at all does too."""
    only_packed = {bucket: {"packed": 1e-4} for bucket in TOKEN_BUCKETS}
    assert plan_from_timings("bfloat16", only_packed, ("dequantize",)).paths == ("dequantize",) * 5
    partial = {1: {"packed": 1e-4, "dequantize": 1e-5}}
    assert plan_from_timings("bfloat16", partial, ("packed", "dequantize")).paths == (
        "dequantize", "packed", "packed", "packed", "packed")


def _int4():
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (192, 256), generator=generator)
    scales = torch.rand(4, 192, generator=generator) / 50
    biases = torch.randn(4, 192, generator=generator) / 50
    return pack_int4(codes, scales, biases, 64, torch.bfloat16)


def _int8_grouped():
    generator = torch.Generator().manual_seed(4)
    codes = torch.randint(-128, 128, (128, 8, 32), dtype=torch.int8, generator=generator)
    return pack_int8_grouped(codes, torch.rand(8, 128, generator=generator) / 50)


def _int8_channel():
    generator = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (96, 128), generator=generator)
    return pack_int8(codes, torch.rand(96, generator=generator) / 50, torch.full((96,), 120), torch.bfloat16)


@pytest.mark.parametrize("make", [_int4, _int8_grouped, _int8_channel])
def test_every_path_computes_the_kept_weight(make, monkeypatch):
    """``dequantize`` and ``dense``: the kept weight in float32, exactly (tiles too); ``packed-bf16``: within the
    rounding of bfloat16 activations and outputs."""
    weight = make()
    dense = weight.dequantize(torch.float32)
    x = torch.randn(5, weight.in_features, generator=torch.Generator().manual_seed(6))
    expected = x @ dense.t()
    assert torch.allclose(run_path(weight, "dequantize", x), expected, atol=1e-5)
    assert torch.allclose(run_path(weight, "dense", x, dense), expected, atol=1e-5)
    monkeypatch.setattr(weight_paths, "DEQUANTIZE_TILE", 64 * weight.in_features)  # tiles of 64 rows
    assert torch.allclose(run_path(weight, "dequantize", x), expected, atol=1e-5)
    error = float((run_path(weight, "packed-bf16", x) - expected).norm() / expected.norm())
    assert error <= 1e-2
    assert run_path(weight, "packed", x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_a_bad_path_is_refused_by_name():
    weight, x = _int4(), torch.randn(2, 256)
    with pytest.raises(ValueError, match="unknown kernel path 'fast'"):
        run_path(weight, "fast", x)
    with pytest.raises(ValueError, match="the dense path needs the kept dequantized weight"):
        run_path(weight, "dense", x)


def test_a_dtype_without_a_plan_runs_the_static_rule(monkeypatch):
    weight = _int4()
    ran: list[str] = []
    monkeypatch.setattr(weight_paths, "run_path", lambda w, p, x, d=None: ran.append(p) or x)
    plans = (TokenPlan("bfloat16", ("dequantize",) * 5, "measured"),)
    run_planned(weight, plans, torch.randn(3, 256, dtype=torch.bfloat16))
    run_planned(weight, plans, torch.randn(3, 256))
    assert ran == ["dequantize", "packed-bf16"]
    assert available_paths(weight, torch.float32, exact=True) == ("dequantize",)


def test_timings_are_measured_once_then_read_from_the_cache_on_disk(monkeypatch, tmp_path):
    """The first plan of a layer kind times it (here: an injected table), the next process reads the file
    (keyed by the fingerprint of torch, CPU, threads and the kernels' sources), a damaged file is measured again."""
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "1")
    monkeypatch.setattr(kernel_timing, "_memory", {})
    calls: list[int] = []
    table = {b: {"packed": 1e-3 * b, "dequantize": 1e-2} for b in TOKEN_BUCKETS}

    def fake_measure(paths, in_features, dtype, buckets=TOKEN_BUCKETS):
        calls.append(in_features)
        assert set(paths) == {"packed", "dequantize", "dense"}  # a dense copy of the slice is timed too
        return table

    monkeypatch.setattr(kernel_timing, "measure_paths", fake_measure)
    weight = _int4()
    plan = plan_weight_paths(weight, "test:int4", torch.bfloat16)
    assert plan.paths == ("packed", "packed", "dequantize", "dequantize", "dequantize") and plan.source == "measured"
    files = list((tmp_path / "kernel-timings").glob("*.json"))
    assert len(files) == 1 and "test:int4:K=256:N=192:bfloat16" in json.loads(files[0].read_text())
    monkeypatch.setattr(kernel_timing, "_memory", {})  # a new process
    assert plan_weight_paths(weight, "test:int4", torch.bfloat16) == plan
    assert calls == [256]
    files[0].write_text("{not json")
    monkeypatch.setattr(kernel_timing, "_memory", {})
    assert plan_weight_paths(weight, "test:int4", torch.bfloat16) == plan
    assert calls == [256, 256]


def test_measuring_for_real_takes_every_bucket_and_prunes_a_hopeless_path():
    slow_calls: list[int] = []

    def slow(x: torch.Tensor) -> torch.Tensor:
        slow_calls.append(x.shape[0])
        torch.ones(1).add_(1)
        import time

        time.sleep(0.06)
        return x

    timings = kernel_timing.measure_paths({"fast": lambda x: x * 2, "slow": slow}, 16, torch.float32)
    assert set(timings) == set(TOKEN_BUCKETS)
    assert all(timings[b]["fast"] < timings[b].get("slow", 1.0) for b in TOKEN_BUCKETS)
    # too slow and far behind at 1 and 8 tokens: never timed at more
    assert set(slow_calls) == {1, 8}


def test_a_path_whose_fixed_cost_amortizes_is_timed_where_it_catches_up(monkeypatch):
    """Dequantizing every call costs the same at 1 token as at 512: far behind the packed kernel at small inputs,
    it wins at large ones, so it is not pruned as hopeless (its gap to the kept dense weight never closes: that
    is not the comparison); a kernel slower per token (float32 packed) is."""
    monkeypatch.setattr(kernel_timing, "_timed", lambda call, x: call(x))
    seconds = {"packed-bf16": lambda x: 5e-4 + 4e-4 * x.shape[0],  # 0.9 ms at 1 token, 205 ms at 512
               "packed": lambda x: 2e-2 * x.shape[0],  # the float32 kernel: 22x behind, and more with tokens
               "dequantize": lambda x: 5e-2 + 1e-4 * x.shape[0],  # 55x behind at 1 token, 0.55x at 512
               "dense": lambda x: 2e-4 + 5e-6 * x.shape[0],  # the kept weight: a dequantization never catches it
               "fixed-cost": lambda x: 6e-2 + 1e-4 * x.shape[0]}  # any path whose gap closes, not only the twin
    timings = kernel_timing.measure_paths(seconds, 16, torch.float32)
    assert "dequantize" in timings[512] and "fixed-cost" in timings[512] and "packed" not in timings[512]
    plan = plan_from_timings("float32", timings, ["packed", "packed-bf16", "dequantize"], exact=False)
    assert plan.path_for(1) == "packed-bf16" and plan.path_for(512) == "dequantize"


def test_measuring_can_be_turned_off_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "0")
    assert plan_weight_paths(_int4(), "test:off", torch.float32).source == "static"
    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "maybe")
    with pytest.raises(SettingError, match="LOADER_KERNEL_MEASURE"):
        plan_weight_paths(_int4(), "test:off", torch.float32)


def test_the_report_records_the_path_per_dtype_and_bucket():
    plan = TokenPlan("float32", ("packed-bf16",) * 3 + ("dequantize",) * 2, "measured")
    record = KernelChoice("int4pack", paths=(plan,)).record()
    assert record == {"kernel": "int4pack", "reason": None, "paths_from": "measured", "by_tokens": {"float32": {
        "1": "packed-bf16", "2-16": "packed-bf16", "17-64": "packed-bf16", "65-256": "dequantize",
        "257+": "dequantize"}}}
    assert KernelChoice("int4pack").record() == {"kernel": "int4pack", "reason": None}
    assert 0 < PACKED_BF16_LOGITS_TOLERANCE < 0.05


def test_a_layer_is_timed_whole_up_to_a_size_then_over_whole_dequantized_tiles():
    """A short slice is not the layer per row (it fits the cache the layer does not, and skips the dequantized
    twin's per-tile costs), so a layer is timed whole up to MEASURE_MAX_WEIGHTS, beyond that over as many whole
    tiles as hold that many weights."""
    assert dequantize_tile_rows(2048) == 2048 and dequantize_tile_rows(5632) == 704
    assert dequantize_tile_rows(1 << 20) == 64
    assert measure_rows(11264, 2048) == 11264  # gate_up of the 1 GB Llama: whole
    assert measure_rows(2048, 5632) == 2048
    assert measure_rows(28672, 4096) == MEASURE_MAX_WEIGHTS // 4096  # a 7B's gate_up: 8192 rows, 8 tiles
    assert measure_rows(28672, 4096) % dequantize_tile_rows(4096) == 0
    assert measure_rows(1 << 16, 1 << 20) == 64  # one tile at least
    assert measure_rows(1 << 16 | 3, 1 << 20) == (1 << 16) | 3  # not whole blocks of 64: every row
