"""``loader.load_model("x.gguf")`` gives transformers' logits for the same GGUF, for every type and family."""

from __future__ import annotations

import pytest
import torch

import loader
from tests.helpers.gguf_files import K_QUANTS, QUANTIZABLE, Q
from tests.helpers.hf_checkpoints import reference_logits, relative_error

TOLERANCE = 1e-4


def transformers_gguf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def compare(path, vocab):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (2, 11))
    ours = loader.load_model(str(path), dtype="float32")
    with torch.no_grad():
        got = ours(ids)
    expected = reference_logits(transformers_gguf(path), ids)
    assert got.shape == expected.shape
    return relative_error(got, expected)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_llama_every_quantizable_type_matches_transformers(tiny_gguf, qtype):
    path, model = tiny_gguf("llama", qtype, rope_scaling=None)
    assert compare(path, model.config.vocab_size) <= TOLERANCE


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
def test_llama_k_quants_match_transformers(tiny_gguf, qtype):
    path, model = tiny_gguf("llama", qtype, rope_scaling=None, hidden_size=256, intermediate_size=512)
    assert compare(path, model.config.vocab_size) <= TOLERANCE


@pytest.mark.parametrize(("family", "qtype", "overrides"), [
    ("qwen2", Q.Q8_0, {}),
    ("qwen2", Q.Q4_1, {"tie_word_embeddings": False}),
    ("qwen3", Q.Q5_0, {"head_dim": 128}),  # transformers' GGUF path ignores key_length: Qwen3's default is 128
], ids=["qwen2-tied", "qwen2-untied", "qwen3"])
def test_qwen_families_match_transformers(tiny_gguf, family, qtype, overrides):
    path, model = tiny_gguf(family, qtype, **overrides)
    assert compare(path, model.config.vocab_size) <= TOLERANCE


def test_llama3_rope_scaling_from_rope_freqs_matches_the_original_checkpoint(tiny_gguf):
    """transformers drops rope_freqs; we recover the scaling, so we match the HF model the file came from."""
    path, model = tiny_gguf("llama")
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    with torch.no_grad():
        got = loader.load_model(str(path), dtype="float32")(ids)
    assert relative_error(got, reference_logits(model, ids)) <= 1e-5
    assert relative_error(got, reference_logits(transformers_gguf(path), ids)) > 1e-4  # it really matters


def test_qwen3_head_dim_from_key_length_matches_the_original_checkpoint(tiny_gguf):
    path, model = tiny_gguf("qwen3")  # head_dim 32 != hidden / heads
    ids = torch.arange(12).view(1, 12)
    with torch.no_grad():
        got = loader.load_model(str(path), dtype="float32")(ids)
    assert relative_error(got, reference_logits(model, ids)) <= 1e-5


def test_bfloat16_load_stays_close_to_float32(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None)
    ids = torch.arange(10).view(1, 10)
    with torch.no_grad():
        full = loader.load_model(str(path), dtype="float32")(ids)
        half = loader.load_model(str(path), dtype="bfloat16")(ids)
    assert half.dtype in (torch.bfloat16, torch.float32)
    assert relative_error(half.float(), full) < 3e-2


@pytest.mark.parametrize(("family", "parts"), [("qwen2", 4), ("llama", 3)])
def test_split_set_loads_like_the_single_file(tmp_path, tiny_gguf, family, parts):
    """The llama's untied ``output.weight`` lies in the last part: the configuration must see every part's
    tensors (reading only the first part's names tied the head to the embedding: other logits, no error)."""
    from tests.helpers.gguf_files import write_gguf

    single, model = tiny_gguf(family, Q.Q8_0, **({"rope_scaling": None} if family == "llama" else {}))
    first = write_gguf(tmp_path / "m.gguf", model, family, qtype=Q.Q8_0, split_max_tensors=7)
    assert first.name == f"m-00001-of-0000{parts}.gguf"
    assert model.config.tie_word_embeddings == (family == "qwen2")
    ids = torch.arange(9).view(1, 9)
    with torch.no_grad():
        from_parts = loader.load_model(str(tmp_path), dtype="float32")(ids)
        from_file = loader.load_model(str(single), dtype="float32")(ids)
    assert torch.equal(from_parts, from_file)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16])
def test_float_tensors_in_the_load_dtype_are_mapped_not_copied(tiny_gguf, monkeypatch, qtype):
    path, _ = tiny_gguf("llama", qtype, rope_scaling=None)
    dtype = "float32" if qtype == Q.F32 else "float16"
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "1")
    mapped, report = loader.load_model_with_report(str(path), dtype=dtype)
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "0")
    copied, copied_report = loader.load_model_with_report(str(path), dtype=dtype)

    assert report.bytes_mapped > 0 and copied_report.bytes_mapped == 0  # q/k (rotary permuted) are read
    for (name, a), (_, b) in zip(mapped.state_dict().items(), copied.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.arange(10).view(1, 10)
    with torch.no_grad():
        assert torch.equal(mapped(ids), copied(ids))
