"""Checkpoints with their own modeling code (``auto_map``) run it only with ``trust_remote_code``.

The checkpoint's modeling file writes a marker file when it is imported, so
each refusal can show that none of the checkpoint's code ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.dynamic_module_utils

import loader
from loader.errors import TrustRemoteCodeError
from tests.helpers.hf_fallback_checkpoints import FALLBACK_FAMILIES, reference_logits, save_fallback_checkpoint

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64]])
TINY_LLAMA = dict(FALLBACK_FAMILIES["phi3"])
REPO = Path(__file__).resolve().parents[3]

_MODELING = '''
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM

Path({marker!r}).write_text("imported")


class MarkerConfig(LlamaConfig):
    model_type = "marker_llama"


class MarkerForCausalLM(LlamaForCausalLM):
    config_class = MarkerConfig
'''


@pytest.fixture(autouse=True)
def _modules_cache(tmp_path, monkeypatch):
    """transformers copies trusted modeling files here: keep them out of the user's cache."""
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))


def _remote_code_checkpoint(folder: Path, *, architecture: str = "MarkerForCausalLM") -> tuple[object, Path]:
    """A tiny Llama saved with an ``auto_map`` to a modeling file that leaves a marker when imported."""
    reference = save_fallback_checkpoint(folder / "ckpt", "llama", **TINY_LLAMA)
    marker = folder / "imported.marker"
    (folder / "ckpt" / "modeling_marker.py").write_text(_MODELING.format(marker=str(marker)))
    config_path = folder / "ckpt" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(architectures=[architecture], model_type="marker_llama",
                  auto_map={"AutoConfig": "modeling_marker.MarkerConfig",
                            "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"})
    config_path.write_text(json.dumps(config))
    return reference, marker


def test_refused_without_trust_and_nothing_of_it_runs(tmp_path):
    _, marker = _remote_code_checkpoint(tmp_path)
    with pytest.raises(TrustRemoteCodeError) as exc:
        loader.load_model(str(tmp_path / "ckpt"), dtype="float32")
    message = str(exc.value)
    assert "\n" not in message
    assert message == (
        "architecture 'MarkerForCausalLM' is built by the checkpoint's own code (config.json auto_map "
        "AutoModelForCausalLM: modeling_marker.MarkerForCausalLM), which loader runs only when asked: pass "
        "trust_remote_code=True (CLI --trust-remote-code) if you trust the checkpoint's source"
    )
    assert not marker.exists()


def test_loads_its_own_code_with_trust(tmp_path):
    reference, marker = _remote_code_checkpoint(tmp_path)
    model = loader.load_model(str(tmp_path / "ckpt"), dtype="float32", trust_remote_code=True)
    assert marker.exists()
    assert type(model.hf_model).__name__ == "MarkerForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), reference_logits(reference, IDS), atol=1e-5, rtol=0)


def test_an_architecture_transformers_has_uses_its_class_without_running_the_checkpoints(tmp_path):
    reference, marker = _remote_code_checkpoint(tmp_path, architecture="LlamaForCausalLM")
    config_path = tmp_path / "ckpt" / "config.json"
    config = json.loads(config_path.read_text())
    config["model_type"] = "llama"
    config_path.write_text(json.dumps(config))
    model = loader.load_model(str(tmp_path / "ckpt"), dtype="float32", model_impl="transformers")
    assert type(model.hf_model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), reference_logits(reference, IDS), atol=1e-5, rtol=0)


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env_code = (f"import transformers.dynamic_module_utils as d; d.HF_MODULES_CACHE = {str(cache)!r}; "
                "from loader._cli.main import main; raise SystemExit(main())")
    return subprocess.run([sys.executable, "-c", env_code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_cli_inspect_and_load_run_nothing_without_the_flag(tmp_path):
    _, marker = _remote_code_checkpoint(tmp_path)
    folder = str(tmp_path / "ckpt")
    cache = tmp_path / "hf-modules"
    assert _cli("inspect", folder, cache=cache).returncode == 0
    refused = _cli("inspect", "--layers", folder, cache=cache)
    assert refused.returncode == 2 and "--trust-remote-code" in refused.stderr
    refused = _cli("load", folder, cache=cache)
    assert refused.returncode == 2 and "--trust-remote-code" in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert not marker.exists()
    trusted = _cli("load", "--trust-remote-code", "--dtype", "float32", folder, cache=cache)
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert marker.exists()
