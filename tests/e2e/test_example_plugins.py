"""docs/examples/loader-plugin-scaled-llama: an out-of-tree Llama variant, built, installed and loaded.

The example subclasses loader-plugin-llama's model class (a declared
dependency). The fast tests read it from its source folder; the slow one builds
its wheel, installs it in a fresh environment layered over this one
(``tests/helpers/layered_venv.py``), lists it with ``loader models`` and
compares its logits with ``transformers``' Llama fed embeddings scaled by the
same multiplier.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from loader.errors import ConfigError
from loader.models import ModelContext
from tests.helpers.hf_checkpoints import FAMILIES, build_model
from tests.helpers.layered_venv import REPO, create_layered_venv
from tests.helpers.toy_models import forget_module

EXAMPLE = REPO / "docs" / "examples" / "loader-plugin-scaled-llama"
ARCHITECTURE = "ScaledEmbeddingLlamaForCausalLM"
CLASS_PATH = "loader_plugin_scaled_llama.model:ScaledEmbeddingLlamaForCausalLM"


@pytest.fixture
def example_source(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    yield
    forget_module("loader_plugin_scaled_llama")


def test_the_example_is_under_60_lines_of_code():
    lines = [line for path in (EXAMPLE / "src").rglob("*.py")
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) < 60, len(lines)


@pytest.mark.parametrize("value", [None, 0, -1.5, "2", True])
def test_a_bad_embedding_multiplier_is_named(example_source, value):
    from loader_plugin_scaled_llama.model import ScaledEmbeddingLlamaForCausalLM

    config = {**FAMILIES["llama"], "architectures": [ARCHITECTURE]}
    if value is not None:
        config["embedding_multiplier"] = value
    expected = (f"{ARCHITECTURE}: config field 'embedding_multiplier' is required but missing" if value is None
                else f"{ARCHITECTURE}: config field 'embedding_multiplier' must be a number")
    with pytest.raises(ConfigError, match=expected):
        ScaledEmbeddingLlamaForCausalLM(ModelContext(hf_config=config, dtype=torch.float32))


LOAD = """
import json, sys
import torch
import loader
model = loader.load_model(sys.argv[1], dtype="float32")
error = (model(torch.load(sys.argv[2])) - torch.load(sys.argv[3])).abs().max().item()
print(json.dumps({"class": type(model).__name__, "max_error": error}))
"""


@pytest.mark.slow
def test_installed_example_loads_and_matches_transformers(tmp_path):
    env = create_layered_venv(tmp_path / "venv")
    env.install_built_wheel(EXAMPLE, tmp_path / "dist")
    assert (env.site_packages / "loader_plugin_scaled_llama" / "model.py").is_file()

    listed = subprocess.run(["loader", "models", "--json"], env=env.env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["architecture"] == ARCHITECTURE)
    assert (row["plugin"], row["class_path"]) == ("scaled_llama", CLASS_PATH)
    assert row["supports_tensor_parallel"] is True, "capabilities are inherited from the Llama class"

    multiplier = 2.5
    hf_model = build_model("llama")
    checkpoint = tmp_path / "scaled-llama"
    hf_model.save_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(architectures=[ARCHITECTURE], embedding_multiplier=multiplier)
    (checkpoint / "config.json").write_text(json.dumps(config))
    ids = torch.tensor([[0, 5, 17, 3, 200, 9, 42]])
    with torch.no_grad():
        expected = hf_model(inputs_embeds=hf_model.model.embed_tokens(ids) * multiplier, use_cache=False).logits
        unscaled = hf_model(input_ids=ids, use_cache=False).logits
    assert (expected - unscaled).abs().max() > 1e-2, "the multiplier must change the logits to be tested"
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(expected, tmp_path / "expected.pt")

    done = subprocess.run([str(env.python), "-c", LOAD, str(checkpoint), str(tmp_path / "ids.pt"),
                           str(tmp_path / "expected.pt")], env=env.env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["class"] == ARCHITECTURE
    assert result["max_error"] < 1e-4
