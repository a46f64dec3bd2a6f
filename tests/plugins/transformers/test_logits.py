"""The fallback loads architectures no plugin registers, with transformers' own logits."""

from __future__ import annotations

import pytest
import torch

import loader
from tests.helpers.hf_fallback_checkpoints import FALLBACK_FAMILIES, reference_logits, save_fallback_checkpoint

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64], [5, 6, 7, 8, 9, 10, 11, 12]])


@pytest.mark.parametrize("model_type", sorted(FALLBACK_FAMILIES))
def test_fallback_logits_equal_transformers(tmp_path, model_type):
    reference = save_fallback_checkpoint(tmp_path, model_type)
    model, report = loader.load_model_with_report(str(tmp_path), dtype="float32")
    assert report.model_impl == "transformers"
    assert report.fallback_reason is not None and reference.config.architectures[0] in report.fallback_reason
    with torch.no_grad():
        got = model(IDS)
    torch.testing.assert_close(got, reference_logits(reference, IDS), atol=1e-5, rtol=0)


def test_untied_head_and_greedy_generation_with_cache(tmp_path):
    from loader._generation import greedy_tokens

    reference = save_fallback_checkpoint(tmp_path, "gemma", tie_word_embeddings=False)
    model = loader.load_model(str(tmp_path), dtype="float32")
    assert model.hf_model.lm_head.weight is not model.hf_model.model.embed_tokens.weight
    prompt = [1, 17, 42, 99]
    got = list(greedy_tokens(model, prompt, max_new_tokens=6))
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, min_new_tokens=6,
                                  eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert got == expected


def test_tied_embeddings_share_one_parameter(tmp_path):
    save_fallback_checkpoint(tmp_path, "gpt2")
    model = loader.load_model(str(tmp_path), dtype="float32")
    assert model.hf_model.lm_head.weight is model.hf_model.transformer.wte.weight


def test_dtype_is_applied(tmp_path):
    save_fallback_checkpoint(tmp_path, "olmo2")
    model = loader.load_model(str(tmp_path), dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
