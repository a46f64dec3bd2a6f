"""Greedy generation with the KV cache equals transformers' greedy generate; the CLI prints it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loader
from loader._generation import encode_prompt, generate_greedy, greedy_tokens, tokenizer_for
from tests.helpers.hf_checkpoints import save_checkpoint
from tests.helpers.tokenizers_files import write_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("llama-gen")
    reference = save_checkpoint("llama", path)
    write_tokenizer(path)
    return path, reference


def _bundle(path: Path):  # type: ignore[no-untyped-def]
    return tokenizer_for(str(path))


def test_greedy_tokens_match_transformers_generate(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, reference = checkpoint
    model = loader.load_model(str(path), dtype="float32")
    prompt = [7, 19, 33, 101, 5]
    ours = list(greedy_tokens(model, prompt, max_new_tokens=12))
    with torch.no_grad():
        theirs = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,  # type: ignore[attr-defined]
                                    eos_token_id=None, pad_token_id=0)
    assert ours == theirs[0, len(prompt):].tolist()


def test_chat_prompt_is_encoded_through_the_template(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, _ = checkpoint
    bundle = _bundle(path)
    ids = encode_prompt(bundle, "w10 w11", chat=True)
    # "<|im_start|>user\nw10 w11<|im_end|>\n<|im_start|>assistant\n"; role words are not in the tiny vocab
    assert ids == [3, 0, 10, 11, 4, 3, 0]
    assert encode_prompt(bundle, "w10 w11", chat=False) == [10, 11]


def test_generation_stops_at_eos(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, _ = checkpoint
    model = loader.load_model(str(path), dtype="float32")
    first = next(greedy_tokens(model, [7, 19, 33], max_new_tokens=1))
    stopped = list(greedy_tokens(model, [7, 19, 33], max_new_tokens=10, stop_ids=[first]))
    assert stopped == [first]


def test_generate_result_text(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, _ = checkpoint
    model = loader.load_model(str(path), dtype="float32")
    result = generate_greedy(model, _bundle(path), "w10 w11 w12", max_new_tokens=5)
    assert len(result.output_ids) <= 5
    assert all(word.startswith("w") or word.startswith("<") for word in result.text.split())


def test_cli_generate_json(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, _ = checkpoint
    out = subprocess.run([sys.executable, "-m", "loader._cli.main", "generate", str(path), "--prompt", "w10 w11",
                          "--chat", "--max-new-tokens", "4", "--dtype", "float32", "--json"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert 1 <= len(data["output_ids"]) <= 4
    assert data["generated_tokens"] == len(data["output_ids"])
    assert data["prompt_tokens"] == 7
    assert data["load"]["architecture"] == "LlamaForCausalLM"
    assert data["prefill_seconds"] > 0
    assert data["threads"] >= 1
    if data["generated_tokens"] > 1:
        rate = (data["generated_tokens"] - 1) / data["decode_seconds"]
        assert data["decode_tokens_per_second"] == pytest.approx(rate, rel=1e-2)
    else:
        assert data["decode_tokens_per_second"] is None


def test_generation_result_times_the_prefill_apart(checkpoint) -> None:  # type: ignore[no-untyped-def]
    path, _ = checkpoint
    model = loader.load_model(str(path), dtype="float32")
    result = generate_greedy(model, _bundle(path), "w10 w11 w12", max_new_tokens=6)
    assert 0 < result.prefill_seconds <= result.seconds
    assert result.decode_seconds == pytest.approx(result.seconds - result.prefill_seconds)
    if len(result.output_ids) > 1:
        assert result.decode_tokens_per_second == pytest.approx((len(result.output_ids) - 1) / result.decode_seconds)


def test_decode_rate_is_none_without_a_second_token() -> None:
    from loader._generation import GenerationResult

    one = GenerationResult((1, 2), (3,), "x", seconds=0.5, prefill_seconds=0.5)
    assert one.decode_tokens_per_second is None
    assert one.tokens_per_second == 2.0
    three = GenerationResult((1, 2), (3, 4, 5), "x", seconds=1.5, prefill_seconds=0.5)
    assert three.decode_tokens_per_second == 2.0


def test_cli_generate_chat_without_template_is_one_line(tmp_path: Path) -> None:
    save_checkpoint("llama", tmp_path)
    write_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    out = subprocess.run([sys.executable, "-m", "loader._cli.main", "generate", str(tmp_path), "--prompt", "w10",
                          "--chat"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 2
    assert out.stderr == "error: --chat asked for, but the checkpoint has no chat template\n"
