"""The CLI says when the fallback is used and why, lists what it covers, and refuses a bad --model-impl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.hf_fallback_checkpoints import save_fallback_checkpoint
from tests.helpers.tokenizers_files import write_tokenizer


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loader._cli.main", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_fallback_checkpoint(folder, "gpt2")
    write_tokenizer(folder)
    return folder


def test_models_lists_the_fallback_and_what_it_covers():
    result = run_cli("models", "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["architecture"]: r for r in json.loads(result.stdout)}
    fallback = rows["TransformersForCausalLM"]
    assert fallback["fallback"] is True and fallback["plugin"] == "transformers"
    assert {"GPT2LMHeadModel", "GemmaForCausalLM", "Phi3ForCausalLM", "LlamaForCausalLM"} <= set(
        fallback["fallback_for"])
    assert rows["LlamaForCausalLM"]["fallback"] is False
    table = run_cli("models")
    assert "TransformersForCausalLM (plugin transformers) is the fallback" in table.stdout


def test_inspect_says_the_fallback_serves_it_and_why(gpt2):
    result = run_cli("inspect", str(gpt2), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert (info["architecture"], info["plugin"], info["model_impl"]) == ("GPT2LMHeadModel", "transformers",
                                                                           "transformers")
    assert info["fallback_reason"] == "no installed plugin registers GPT2LMHeadModel natively"
    text = run_cli("inspect", str(gpt2)).stdout
    assert "model impl    transformers fallback (no installed plugin registers GPT2LMHeadModel natively)" in text


def test_load_report_says_the_fallback_was_used(gpt2):
    result = run_cli("load", str(gpt2), "--dtype", "float32", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["model_impl"] == "transformers"
    assert report["fallback_reason"] == "no installed plugin registers GPT2LMHeadModel natively"


def test_generate_through_the_fallback(gpt2):
    result = run_cli("generate", str(gpt2), "--prompt", "w10 w11", "--max-new-tokens", "4", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["output_ids"]) == 4 and out["load"]["model_impl"] == "transformers"


def test_unknown_model_impl_is_one_line(gpt2):
    result = run_cli("load", str(gpt2), "--model-impl", "vllm")
    assert result.returncode == 2
    assert result.stderr == ("error: argument --model-impl: invalid choice: 'vllm' (choose from 'auto', 'native', "
                             "'transformers') (see 'loader load --help')\n")


def test_listing_what_the_fallback_covers_imports_neither_torch_nor_transformers_here():
    code = ("import sys; from loader._registry import get_registry; "
            "info = get_registry().model_info('TransformersForCausalLM'); "
            "print(len(info.fallback_for) > 100, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300, check=True).stdout
    assert out.strip() == "True []"
