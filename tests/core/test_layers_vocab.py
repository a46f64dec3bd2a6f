"""Vocabulary-parallel embedding and LM head: padding, masked lookup, narrowed loads, tying."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loader import _distributed as distributed
from loader.errors import ShapeMismatchError
from loader.layers import ParallelLMHead, VocabParallelEmbedding
from loader.layers.param_layout import weight_loader_of
from loader.weights import EagerTensor
from tests.helpers.recording_tensor import RecordingTensor

VOCAB, DIM = 100, 8


def _build(cls, rank, size, *args, **kwargs):
    with distributed.simulated_tp(rank, size):
        return cls(*args, **kwargs)


def _table():
    return torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("size", "padded", "per_rank"), [(1, 128, 128), (2, 128, 64), (4, 256, 64)])
def test_padding_is_a_multiple_of_64_times_tp(size, padded, per_rank):
    layers = [_build(VocabParallelEmbedding, r, size, VOCAB, DIM) for r in range(size)]
    assert all(layer.num_embeddings_padded == padded for layer in layers)
    assert [layer.weight.shape[0] for layer in layers] == [per_rank] * size
    assert [(layer.vocab_start, layer.vocab_end) for layer in layers] == [
        (r * per_rank, (r + 1) * per_rank) for r in range(size)
    ]
    assert sum(layer.real_rows for layer in layers) == VOCAB


def test_custom_padding_size():
    layer = VocabParallelEmbedding(VOCAB, DIM, padding_size=1)
    assert layer.weight.shape == (VOCAB, DIM)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_loader_reads_only_own_rows_and_zeroes_padding(size):
    table = _table()
    for rank in range(size):
        layer = _build(VocabParallelEmbedding, rank, size, VOCAB, DIM)
        layer.weight.data.fill_(float("nan"))  # what a materialized, unloaded parameter may hold
        loaded = RecordingTensor(table, "model.embed_tokens.weight")
        weight_loader_of(layer.weight)(layer.weight, loaded)
        rows = layer.real_rows
        assert loaded.log == ([((layer.vocab_start, rows), (0, DIM))] if rows else [])
        start = layer.vocab_start
        torch.testing.assert_close(layer.weight.data[:rows], table[start:start + rows])
        assert torch.count_nonzero(layer.weight.data[rows:]) == 0


@pytest.mark.parametrize("size", [2, 4])
def test_masked_lookups_sum_to_the_full_embedding(size):
    table = _table()
    ids = torch.tensor([[0, 5, 63, 64, 99], [98, 1, 70, 2, 64]])
    total = torch.zeros(2, 5, DIM)
    for rank in range(size):
        layer = _build(VocabParallelEmbedding, rank, size, VOCAB, DIM)
        weight_loader_of(layer.weight)(layer.weight, EagerTensor(table))
        part = layer(ids)  # no process group: the all-reduce is a no-op, so this is the rank's part
        own = (ids >= layer.vocab_start) & (ids < layer.vocab_end)
        assert torch.count_nonzero(part[~own]) == 0
        total += part
    torch.testing.assert_close(total, F.embedding(ids, table), rtol=0, atol=0)


def test_lm_head_logits_are_float_full_vocab():
    table = _table().to(torch.bfloat16)
    head = ParallelLMHead(VOCAB, DIM, params_dtype=torch.bfloat16)
    weight_loader_of(head.weight)(head.weight, EagerTensor(table))
    hidden = torch.randn(2, 3, DIM).to(torch.bfloat16)
    logits = head(hidden)
    assert logits.shape == (2, 3, VOCAB) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(hidden, table).float())


def test_lm_head_bias_is_split_and_padded():
    bias = torch.arange(float(VOCAB))
    head = _build(ParallelLMHead, 1, 2, VOCAB, DIM, bias=True)
    weight_loader_of(head.bias)(head.bias, EagerTensor(bias))
    torch.testing.assert_close(head.bias.data[:36], bias[64:])
    assert torch.count_nonzero(head.bias.data[36:]) == 0


@pytest.mark.parametrize("size", [1, 2])
def test_lm_head_shards_concatenate_to_full_logits(size):
    table = _table()
    hidden = torch.randn(3, DIM)
    pieces = []
    for rank in range(size):
        head = _build(ParallelLMHead, rank, size, VOCAB, DIM)
        weight_loader_of(head.weight)(head.weight, EagerTensor(table))
        pieces.append(F.linear(hidden, head.weight))
    torch.testing.assert_close(torch.cat(pieces, -1)[:, :VOCAB], F.linear(hidden, table))


def test_tie_weights_shares_the_parameter():
    embed = VocabParallelEmbedding(VOCAB, DIM)
    head = ParallelLMHead(VOCAB, DIM).tie_weights(embed)
    assert head.weight is embed.weight
    weight_loader_of(embed.weight)(embed.weight, EagerTensor(_table()))
    torch.testing.assert_close(head(torch.eye(DIM))[:, :VOCAB], _table().t())
    names = [n for n, _ in torch.nn.ModuleDict({"e": embed, "h": head}).named_parameters()]
    assert names == ["e.weight"]  # deduplicated, so the pipeline sees one parameter to fill


def test_tie_weights_refuses_different_shards():
    embed = _build(VocabParallelEmbedding, 0, 2, VOCAB, DIM)
    with pytest.raises(ValueError, match="cannot tie"):
        _build(ParallelLMHead, 1, 2, VOCAB, DIM).tie_weights(embed)


def test_vocab_shape_mismatch_names_the_tensor():
    layer = VocabParallelEmbedding(VOCAB, DIM, prefix="model.embed_tokens")
    bad = EagerTensor(torch.zeros(VOCAB + 1, DIM), "model.embed_tokens.weight", "model.safetensors")
    with pytest.raises(ShapeMismatchError, match=r"'model.embed_tokens.weight' in model.safetensors: "
                                                 r"expected shape \(100, 8\) for model.embed_tokens, "
                                                 r"found \(101, 8\)"):
        weight_loader_of(layer.weight)(layer.weight, bad)
