"""Tokenizers built from GGUF metadata agree with transformers' GGUF tokenizer and round-trip text."""

from __future__ import annotations

import gguf
import pytest

from loader.checkpoint import TokenizerBundle
from loader.errors import UnsupportedError
from loader_plugin_gguf.format.header import read_header
from loader_plugin_gguf.format.tokenizer import build_tokenizer, merges_from_scores
from tests.helpers.gguf_files import CHAT_TEMPLATE

TEXTS = ["the and then", "What is the capital of France?", "  two  spaces\nnew line\t tab",
         "digits 12345 and café", "<|im_start|>user\nhi there<|im_end|>\n"]


def bundle_of(path) -> TokenizerBundle:
    bundle = build_tokenizer(read_header(path))
    assert bundle is not None
    return bundle


def transformers_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_byte_level_bpe_matches_transformers(tiny_gguf):
    path, _ = tiny_gguf("qwen2")
    bundle = bundle_of(path)
    reference = transformers_tokenizer(path)
    for text in TEXTS:
        ids = bundle.tokenizer.encode(text).ids
        assert ids == reference.encode(text), text
        assert bundle.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert bundle.tokenizer.encode(" the").ids == [bundle.tokenizer.token_to_id("Ġthe")]  # merges applied


def test_byte_level_bundle_fields(tiny_gguf):
    path, _ = tiny_gguf("qwen2")
    bundle = bundle_of(path)
    assert bundle.chat_template == CHAT_TEMPLATE
    assert (bundle.bos_token, bundle.eos_token, bundle.eos_token_ids) == ("<|im_start|>", "<|im_end|>", (2,))
    assert bundle.add_bos_token is False
    assert bundle.tokenizer.encode("<|im_end|>").ids == [2]  # control tokens stay whole


def test_sentencepiece_matches_transformers(tiny_gguf):
    path, _ = tiny_gguf("llama", tokenizer="llama")
    bundle = bundle_of(path)
    reference = transformers_tokenizer(path)
    for text in ("the and then", "What is the weather?", "a\nb", "naïve ☃"):
        ids = bundle.tokenizer.encode(text).ids
        assert ids == reference.encode(text), text
        assert bundle.tokenizer.decode(ids, skip_special_tokens=True) == text
    assert bundle.add_bos_token is True
    assert bundle.tokenizer.encode("the").ids[0] == 1  # BOS added by default for SentencePiece
    assert "<0x0A>" in bundle.tokenizer.id_to_token(bundle.tokenizer.encode("a\nb").ids[2])  # byte fallback


def test_merges_from_scores_rank_by_result_score():
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    assert merges_from_scores(vocab, scores) == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]


def write_tokenizer_file(path, model="gpt2", pre=None):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_header(path)


def test_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    header = write_tokenizer_file(tmp_path / "t.gguf", pre="made-up")
    with pytest.raises(UnsupportedError, match=r"t\.gguf: metadata key 'tokenizer\.ggml\.pre' is 'made-up'"):
        build_tokenizer(header)


def test_unknown_tokenizer_model_is_refused_by_name(tmp_path):
    header = write_tokenizer_file(tmp_path / "t.gguf", model="bert")
    with pytest.raises(UnsupportedError, match=r"t\.gguf: metadata key 'tokenizer\.ggml\.model' is 'bert'"):
        build_tokenizer(header)


@pytest.mark.parametrize(("pre", "text", "pieces"), [
    ("smollm", "ab 12", ["a", "b", "Ġ", "1", "2"]),
    ("llama-bpe", "ab 1234", ["a", "b", "Ġ", "1", "2", "3", "4"]),
])
def test_pre_tokenizer_rules_by_name(tmp_path, pre, text, pieces):
    from loader_plugin_gguf.format.pretokenizers import pre_tokenizer_for

    split = [p for p, _ in pre_tokenizer_for(pre, "x").pre_tokenize_str(text)]
    joined = "".join(split)
    assert joined == "".join(pieces)
    if pre == "smollm":
        assert split == ["ab", "Ġ", "1", "2"]
    else:
        assert split == ["ab", "Ġ", "123", "4"]


def test_file_without_vocabulary_has_no_tokenizer(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert build_tokenizer(read_header(tmp_path / "n.gguf")) is None
