"""``model_impl``: native classes win under ``auto``; ``transformers`` forces the fallback, ``native`` forbids it."""

from __future__ import annotations

import pytest
import torch

import loader
from loader.errors import UnknownArchitectureError, UnsupportedError
from tests.helpers.hf_checkpoints import save_checkpoint
from tests.helpers.hf_fallback_checkpoints import save_fallback_checkpoint

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64]])


def test_native_llama_forced_to_the_fallback_equals_the_native_class(tmp_path):
    save_checkpoint("llama", tmp_path)
    native, native_report = loader.load_model_with_report(str(tmp_path), dtype="float32")
    forced, forced_report = loader.load_model_with_report(str(tmp_path), dtype="float32", model_impl="transformers")
    assert (native_report.model_impl, native_report.fallback_reason) == ("native", None)
    assert forced_report.model_impl == "transformers"
    assert forced_report.fallback_reason == "model_impl='transformers' was asked for"
    assert type(forced).__name__ == "TransformersForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(forced(IDS), native(IDS), atol=1e-5, rtol=0)


def test_auto_prefers_the_native_class(tmp_path):
    save_checkpoint("llama", tmp_path)
    assert type(loader.load_model(str(tmp_path), dtype="float32")).__name__ == "LlamaForCausalLM"


def test_native_rules_out_the_fallback(tmp_path):
    save_fallback_checkpoint(tmp_path, "gpt2")
    with pytest.raises(UnknownArchitectureError, match=r"\['GPT2LMHeadModel'\].*model_impl='native' rules out"):
        loader.load_model(str(tmp_path), model_impl="native")


def test_unknown_model_impl_is_refused_by_name(tmp_path):
    save_fallback_checkpoint(tmp_path, "gpt2")
    with pytest.raises(UnsupportedError, match=r"^model_impl 'vllm' is not supported; use one of auto, native, "
                                               r"transformers$"):
        loader.load_model(str(tmp_path), model_impl="vllm")


def test_a_gguf_file_forced_to_the_fallback_equals_the_native_class(tmp_path):
    """Any format that yields Hugging Face names feeds the fallback: GGUF names are mapped by the gguf plugin."""
    pytest.importorskip("loader_plugin_gguf")
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "llama.gguf", build_model("llama", tiny_config("llama", vocab_size=320)), "llama")
    native = loader.load_model(str(path), dtype="float32")
    forced, report = loader.load_model_with_report(str(path), dtype="float32", model_impl="transformers")
    assert (report.load_format, report.model_impl) == ("gguf", "transformers")
    with torch.no_grad():
        torch.testing.assert_close(forced(IDS), native(IDS), atol=1e-5, rtol=0)
