"""The GGUF token embedding keeps its blocks; lookups and a tied head read the same bytes (issue 17).

References are gguf-py's own dequantization of the whole tensor (``gguf.quants.dequantize``), indexed.
Every file is written by gguf-py's GGUFWriter (:mod:`tests.helpers.gguf_files`); the hidden size is
256 so K-quant rows are whole super-blocks.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import loader
from loader.errors import PluginError
from loader.layers import VocabParallelEmbedding
from loader.testing import simulated_tp
from tests.helpers.gguf_files import Q
from tests.helpers.hf_checkpoints import relative_error

SIZES = {"hidden_size": 256, "intermediate_size": 512}
EMBEDDING_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.F16)


def _family_options(family: str) -> dict[str, object]:
    return {**SIZES, **({"rope_scaling": None} if family == "llama" else {})}


def _reference_table(path) -> torch.Tensor:
    """gguf-py's float32 dequantization of the whole ``token_embd.weight``."""
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    values = gguf.quants.dequantize(np.array(tensor.data), tensor.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def _ids(vocab: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (3, 17), generator=torch.Generator().manual_seed(1))
    ids[0, :3] = torch.tensor([0, vocab - 1, 0])  # the edges, and a repeat
    return ids


@pytest.mark.parametrize("qtype", EMBEDDING_TYPES, ids=lambda q: q.name)
def test_looked_up_rows_are_gguf_py_dequantization_bit_for_bit(tiny_gguf, qtype):
    path, model = tiny_gguf("llama", qtype, **_family_options("llama"))  # llama's head is untied here
    loaded, report = loader.load_model_with_report(str(path))
    record = report.quantization["layers"]["model.embed_tokens"]
    assert record == {"kernel": "int8" if qtype in (Q.Q8_0, Q.Q6_K) else "blocks", "types": (qtype.name,),
                      "packed_bytes": record["packed_bytes"], "reason": None, "dtype": None}
    assert 0 < record["packed_bytes"] <= model.config.vocab_size * 256 * 4 * 0.6  # float32 would be 4 B/value
    assert not any("embed_tokens" in name for name, _ in loaded.named_parameters())
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        got = loaded.model.embed_tokens(ids)
    assert got.dtype == torch.float32
    assert torch.equal(got, _reference_table(path)[ids])


def test_a_tied_q8_0_table_kept_as_two_int4_planes_looks_up_gguf_py_s_rows_bit_for_bit(tiny_gguf):
    """The tied head's ``int4x2`` kernel keeps no int8 copy of the codes: rows are read back from its planes."""
    path, model = tiny_gguf("qwen2", Q.Q8_0, **SIZES)
    loaded, report = loader.load_model_with_report(str(path))
    record = report.quantization["layers"]["model.embed_tokens"]
    rows = loaded.model.embed_tokens.num_embeddings_padded  # 288 tokens padded to 320 rows
    assert record["kernel"] == "int4x2"
    # the codes (1 B a value), float32 block scales, and the planes' bfloat16 scales and zeros (2 x 2 x 2 B a block)
    assert record["packed_bytes"] == rows * 256 + rows * 8 * 4 + 2 * rows * 8 * 2 * 2
    assert not hasattr(loaded.model.embed_tokens, "q8_codes")
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(loaded.model.embed_tokens(ids), _reference_table(path)[ids])


def test_a_bfloat16_load_looks_up_the_rows_the_dequantized_bfloat16_table_has(tiny_gguf):
    path, model = tiny_gguf("llama", Q.Q8_0, **_family_options("llama"))
    ids = _ids(model.config.vocab_size)
    kept = loader.load_model(str(path), dtype="bfloat16")
    dense = loader.load_model(str(path), dtype="bfloat16", format_options={"dequantize": True})
    with torch.no_grad():
        assert torch.equal(kept.model.embed_tokens(ids), dense.model.embed_tokens(ids))


@pytest.mark.parametrize(("qtype", "kernel", "tolerance"), [
    (Q.Q8_0, "int4x2", 3e-2),  # the codes' two nibble planes through the int4 kernel, the top 64 recomputed
    (Q.Q6_K, "int8", 3e-2),  # int8 codes per 16-value group (q - 32, scale d*sc), as Q8_0
    (Q.Q4_1, "blocks+int4", 3e-2),  # torch's int4 kernel in bfloat16, as the linears
    (Q.Q4_K, "blocks+int4", 3e-2),
], ids=lambda v: getattr(v, "name", None))
def test_a_tied_head_multiplies_with_the_embeddings_storage(tiny_gguf, qtype, kernel, tolerance):
    path, model = tiny_gguf("qwen2", qtype, **SIZES)
    assert model.config.tie_word_embeddings
    loaded, report = loader.load_model_with_report(str(path))
    assert report.quantization["layers"]["model.embed_tokens"]["kernel"] == kernel
    assert not any(name.startswith("lm_head") for name, _ in loaded.named_parameters())
    hidden = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = loaded.lm_head(hidden)
    expected = hidden @ _reference_table(path).t()
    assert got.shape == expected.shape == (2, 5, model.config.vocab_size)
    assert relative_error(got, expected) <= tolerance
    if kernel in ("int8", "int4x2"):  # the top logits are exact, so greedy decoding picks what the float32 model picks
        top = expected.topk(8, dim=-1).indices
        torch.testing.assert_close(got.gather(-1, top), expected.gather(-1, top), rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize(("qtype", "kernel"), [(Q.Q8_0, "int4x2"), (Q.Q6_K, "int8"), (Q.Q4_1, "blocks+int4")],
                         ids=lambda v: getattr(v, "name", None))
def test_a_head_runs_the_path_its_timings_choose_per_input_size(tiny_gguf, qtype, kernel,
                                                                                    tmp_path, monkeypatch):
    """With timings in which the dequantized head wins at large inputs, a 300-token call dequantizes and a
    1-token call runs the kernel, both within the head's tolerance; the record has the path per bucket."""
    from loader.kernels import TOKEN_BUCKETS, kernel_timing, weight_paths

    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_timing, "_memory", {})
    fixed_cost = {b: {"packed-bf16": 1e-4 * b, "dequantize": 5e-3, "dense": 1e-5 * b} for b in TOKEN_BUCKETS}
    monkeypatch.setattr(kernel_timing, "measure_paths", lambda *args, **kwargs: fixed_cost)
    path, _ = tiny_gguf("qwen2", qtype, **SIZES)
    loaded, report = loader.load_model_with_report(str(path))
    record = report.quantization["layers"]["model.embed_tokens"]
    assert record["kernel"] == kernel and record["paths_from"] == "measured"
    by_tokens = record["by_tokens"]["float32"]
    assert by_tokens["1"] == "packed-bf16" and by_tokens["257+"] == "dequantize"
    ran: list[str] = []
    real_run_path = weight_paths.run_path
    monkeypatch.setattr(weight_paths, "run_path", lambda w, p, x, d=None: ran.append(p) or real_run_path(w, p, x, d))
    table = _reference_table(path)
    for tokens in (1, 300):
        hidden = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            got = loaded.lm_head(hidden)
        assert relative_error(got, hidden @ table.t()) <= 3e-2
    assert ran == ["packed-bf16", "dequantize"]


def test_a_bfloat16_load_s_q8_0_head_gives_float32_logits_exact_at_the_top(tiny_gguf):
    """bfloat16 activations: the head's top logits are the float32 products of the exact rows with the
    bfloat16 hidden state, not rounded to bfloat16 (8 mantissa bits tie logits of 10-20 with each other)."""
    path, _ = tiny_gguf("qwen2", Q.Q8_0, **SIZES)
    loaded = loader.load_model(str(path), dtype="bfloat16")
    hidden = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        got = loaded.lm_head(hidden)
    expected = hidden.float() @ _reference_table(path).t()
    top = expected.topk(8, dim=-1).indices
    torch.testing.assert_close(got.gather(-1, top), expected.gather(-1, top), rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K], ids=lambda q: q.name)
def test_an_int8_head_with_the_float32_kernel_is_float32_accurate_everywhere(tiny_gguf, qtype):
    """Every logit, not only the top: float32 products of the exact codes and scales, summed per block (the
    order of those sums is all that differs from one float32 matmul)."""
    path, _ = tiny_gguf("qwen2", qtype, **SIZES)
    loaded, report = loader.load_model_with_report(str(path), format_options={"kernel_dtype": "float32"})
    record = report.quantization["layers"]["model.embed_tokens"]
    assert record["kernel"] == "int8" and "by_tokens" not in record  # its own exact call, never planned away
    hidden = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = loaded.lm_head(hidden)
    assert relative_error(got, hidden @ _reference_table(path).t()) <= 1e-6


def test_a_tied_head_of_a_type_without_a_kernel_dequantizes_the_table_with_the_reason(tiny_gguf):
    path, model = tiny_gguf("qwen2", Q.Q5_K, **SIZES)
    loaded, report = loader.load_model_with_report(str(path))
    record = report.quantization["layers"]["model.embed_tokens"]
    assert record["kernel"] == "dequantized" and record["packed_bytes"] == 0
    assert record["reason"] == ("ggml type Q5_K has no kernel for the tied output head "
                                "(Q8_0, Q6_K, Q4_0, Q4_1, Q4_K have)")
    table = _reference_table(path)
    ids = _ids(model.config.vocab_size)
    hidden = torch.randn(1, 3, 256, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded.model.embed_tokens(ids), table[ids])
        torch.testing.assert_close(loaded.lm_head(hidden), hidden @ table.t(), rtol=1e-5, atol=1e-5)


def test_the_float32_and_dequantize_paths_keep_a_dense_table(tiny_gguf):
    path, _ = tiny_gguf("qwen2", Q.Q8_0, **SIZES)
    for kwargs in ({"dtype": "float32"}, {"format_options": {"dequantize": True}}):
        model, report = loader.load_model_with_report(str(path), **kwargs)
        assert report.quantization is None
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_keeps_and_looks_up_its_own_vocabulary_rows(tiny_gguf, rank):
    path, _ = tiny_gguf("qwen2", Q.Q8_0, **SIZES)
    table = _reference_table(path)
    with simulated_tp(rank, 2):
        shard = loader.load_model(str(path), format_options={"kernel_dtype": "float32"})
    embed = shard.model.embed_tokens
    local = torch.arange(embed.real_rows)
    with torch.no_grad():
        rows = embed.quant_method.embedding(embed, local)
        logits = embed.quant_method.apply(embed, table[:4])
    assert torch.equal(rows, table[embed.vocab_start:embed.vocab_start + embed.real_rows])
    assert logits.shape == (4, embed.num_embeddings_per_partition)
    expected = table[:4] @ table[embed.vocab_start:embed.vocab_start + embed.real_rows].t()
    torch.testing.assert_close(logits[:, :embed.real_rows], expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(logits[:, embed.real_rows:], torch.zeros_like(logits[:, embed.real_rows:]))


def test_a_config_answering_every_layer_with_its_linear_method_keeps_the_embedding_dense():
    from loader.layers import QuantizationConfig, UnquantizedLinearMethod

    class Linear(QuantizationConfig):
        name = "linear-only"

        def get_quant_method(self, layer, prefix):
            return UnquantizedLinearMethod()

    embedding = VocabParallelEmbedding(128, 8, quant_config=Linear(), prefix="embed")
    assert embedding.quant_method is None and embedding.weight.shape == (128, 8)


def test_a_config_giving_an_embedding_something_else_is_named():
    from loader.layers import QuantizationConfig

    class Odd(QuantizationConfig):
        name = "odd"

        def get_quant_method(self, layer, prefix):
            return "nf4"

    with pytest.raises(PluginError, match=r"^quantization 'odd' gave str for the embedding 'embed'; "
                                          r"an embedding needs an EmbeddingMethodBase$"):
        VocabParallelEmbedding(128, 8, quant_config=Odd(), prefix="embed")


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K, Q.Q4_K], ids=lambda q: q.name)
def test_a_tied_embedding_is_planned_from_the_header_as_the_load_keeps_it(tiny_gguf, qtype):
    """``loader inspect --layers`` predicts the kernel and the bytes kept (Q6_K: 16-value groups' scales)."""
    from loader._pipeline.plan import plan_layers

    path, _ = tiny_gguf("qwen2", qtype, **SIZES)
    planned = plan_layers(str(path))["layers"]["model.embed_tokens"]
    model, report = loader.load_model_with_report(str(path))
    assert planned == report.quantization["layers"]["model.embed_tokens"]
    held = sum(b.numel() * b.element_size() for name, b in model.named_buffers() if name.startswith("model.embed"))
    assert planned["packed_bytes"] == held


def test_the_int8_head_weight_dequantizes_exactly_what_its_kernel_multiplies():
    """``Int8HeadWeight`` (the ``int8`` head as a kernel path weight): its dequantized twin is the codes times
    their block scales, laid out as the head's rows; a slice of rows is those rows."""
    from loader.kernels import run_path
    from loader_plugin_gguf.packed.int8_head import Int8HeadWeight

    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(-128, 128, (4, 128, 32), dtype=torch.int8, generator=generator)
    weight = Int8HeadWeight(codes, torch.rand(4, 128, generator=generator))
    assert (weight.in_features, weight.out_features, weight.kernel_dtype) == (128, 128, torch.float32)
    x = torch.randn(3, 128, generator=generator)
    dense = weight.dequantize()
    torch.testing.assert_close(weight.matmul(x), x @ dense.t(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(run_path(weight, "dequantize", x), x @ dense.t(), rtol=1e-5, atol=1e-4)
    assert torch.equal(weight.rows(64, 128).dequantize(), dense[64:])
