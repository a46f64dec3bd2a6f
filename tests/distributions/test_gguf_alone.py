"""``pip install loader-plugin-gguf`` alone: its wheel and what it requires work, and say what is missing.

Runs in ``tox -e gguf-alone``: a venv with only the loader-core, loader-plugin-gguf and (its
requirement) loader-plugin-llama wheels, third-party requirements from the index and torch from
constraints.txt. Elsewhere (``make test`` installs every plugin) the module is skipped.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.hf_checkpoints import FAMILIES

EXPECTED = os.environ.get("LOADER_EXPECT_ONLY", "")
REPO = Path(__file__).resolve().parents[2]

if not EXPECTED:
    pytest.skip("needs a venv with only loader-core, -gguf and -llama installed: tox -e gguf-alone",
                allow_module_level=True)


def _ours_installed() -> set[str]:
    names = {(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()}
    return {n for n in names if re.match(r"^loader[-_](core|plugin[-_])", n)}


def _run(*command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A fresh process with no plugin allow/deny list: what a user of this venv gets."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOADER_PLUGINS", "LOADER_DISABLE_PLUGINS")}
    return subprocess.run(list(command), capture_output=True, text=True, env=env, timeout=timeout, check=False)


def _loader(*args: str) -> subprocess.CompletedProcess[str]:
    return _run(str(Path(sys.executable).with_name("loader")), *args)  # the console script from the wheel


def test_only_the_gguf_plugin_and_what_it_requires_are_installed() -> None:
    assert _ours_installed() == set(EXPECTED.split(","))
    check = _run(sys.executable, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_version_lists_the_core_and_both_plugins() -> None:
    done = _loader("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{name} {importlib.metadata.version(name)}" for name in
                                        ("loader-core", "loader-plugin-gguf", "loader-plugin-llama")]


def test_smollm2_demo_answers_paris() -> None:
    done = _run(sys.executable, str(REPO / "scripts" / "demo.py"), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = next(line for line in done.stdout.splitlines() if line.startswith("A: "))
    assert "Paris" in answer, done.stdout


def test_a_safetensors_folder_names_the_safetensors_plugin(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**FAMILIES["llama"], "model_type": "llama"}))
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(folder / "model.safetensors"))
    done = _loader("load", str(folder))
    assert done.returncode == 2
    assert done.stderr == (f"error: {folder}: no weight files any installed format plugin recognises (safetensors "
                           "files); loader-plugin-safetensors provides it: pip install loader-plugin-safetensors\n")


def _qwen2_stand_in() -> SimpleNamespace:
    """What ``write_gguf`` reads of a ``transformers`` Qwen2 model (its config and state dict), without transformers."""
    config = SimpleNamespace(**{**FAMILIES["qwen2"], "vocab_size": 288})
    hidden, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        shapes.update({
            f"{prefix}self_attn.q_proj.weight": (hidden, hidden), f"{prefix}self_attn.q_proj.bias": (hidden,),
            f"{prefix}self_attn.k_proj.weight": (kv, hidden), f"{prefix}self_attn.k_proj.bias": (kv,),
            f"{prefix}self_attn.v_proj.weight": (kv, hidden), f"{prefix}self_attn.v_proj.bias": (kv,),
            f"{prefix}self_attn.o_proj.weight": (hidden, hidden),
            f"{prefix}mlp.gate_proj.weight": (inner, hidden), f"{prefix}mlp.up_proj.weight": (inner, hidden),
            f"{prefix}mlp.down_proj.weight": (hidden, inner),
            f"{prefix}input_layernorm.weight": (hidden,), f"{prefix}post_attention_layernorm.weight": (hidden,),
        })
    generator = torch.Generator().manual_seed(0)
    state = {name: 0.02 * torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    return SimpleNamespace(config=config, state_dict=lambda: state)


def test_a_qwen_gguf_names_the_qwen_plugin_and_talks_about_the_gguf_file(tmp_path: Path) -> None:
    from tests.helpers.gguf_files import write_gguf

    path = write_gguf(tmp_path / "qwen.gguf", _qwen2_stand_in(), "qwen2")
    done = _loader("load", str(path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: GGUF file qwen.gguf (metadata general.architecture): architectures "
                                  "['Qwen2ForCausalLM']")
    assert done.stderr.endswith("loader-plugin-qwen provides it: pip install loader-plugin-qwen\n")
    assert "config.json" not in done.stderr
