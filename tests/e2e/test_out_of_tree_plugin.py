"""An out-of-tree model plugin (tests/fixtures/loader-plugin-toymodel) works with nothing but an entry point.

The fast tests import the fixture from its source folder. The slow ones
``pip install`` it into a private folder (``--target``, never the shared
environment, so concurrent test runs don't see it) and use it from fresh
processes with that folder on ``PYTHONPATH``: ``loader models --json`` lists it
and ``loader.load_model`` loads a safetensors checkpoint with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from loader._context import ModelContext
from loader._plugins import create_plugin_host
from loader._registry import ModelRegistry
from loader.errors import ConfigError, ShapeMismatchError, UnexpectedWeightError
from loader.weights import EagerTensor
from tests.helpers.toy_models import forget_module

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "loader-plugin-toymodel"
CLASS_PATH = "loader_plugin_toymodel.model:ToyForCausalLM"


@pytest.fixture
def toymodel_source(monkeypatch):
    """The fixture package importable from its source folder, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(FIXTURE / "src"))
    yield
    forget_module("loader_plugin_toymodel")


def _toy_config(**overrides):
    return {"architectures": ["ToyForCausalLM"], "vocab_size": 16, "hidden_size": 8, **overrides}


def test_plugin_module_imports_light():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURE / "src"), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", "import sys, loader_plugin_toymodel.plugin; "
                               "print(sorted(m for m in ('torch', 'loader_plugin_toymodel.model') "
                               "if m in sys.modules))"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert done.stdout.strip() == "[]"


def test_plugin_registers_its_architecture(toymodel_source):
    import loader_plugin_toymodel.plugin as plugin

    host = create_plugin_host(load_entry_points=False)
    host.register(plugin, "toymodel")
    record = host.records["toymodel"]
    assert record.status == "loaded" and record.hooks == ("loader_register_architectures",)
    entry = ModelRegistry.from_host(host).entry("ToyForCausalLM")
    assert (entry.plugin, entry.class_path) == ("toymodel", CLASS_PATH)


def test_toy_model_loads_named_weights_and_computes_logits(toymodel_source):
    from loader_plugin_toymodel.model import ToyForCausalLM

    model = ToyForCausalLM(ModelContext(hf_config=_toy_config(), dtype=torch.float32))
    embed, head = torch.randn(16, 8), torch.randn(16, 8)
    filled = model.load_weights([("embed.weight", EagerTensor(embed, "embed.weight", "toy.safetensors")),
                                 ("head.weight", EagerTensor(head, "head.weight", "toy.safetensors"))])
    assert filled == {name for name, _ in model.named_parameters()} == {"embed_tokens", "lm_head"}
    ids = torch.tensor([[1, 5, 15]])
    torch.testing.assert_close(model(ids), embed[ids] @ head.T)


def test_toy_model_rejects_unknown_and_misshapen_tensors(toymodel_source):
    from loader_plugin_toymodel.model import ToyForCausalLM

    model = ToyForCausalLM(ModelContext(hf_config=_toy_config(), dtype=torch.float32))
    bias = EagerTensor(torch.zeros(16), "lm_head.bias", "toy.safetensors")
    expected = (r"tensor 'lm_head.bias' in toy.safetensors: ToyForCausalLM has no parameter.*"
                r"expected one of embed.weight, head.weight")
    with pytest.raises(UnexpectedWeightError, match=expected):
        model.load_weights([("lm_head.bias", bias)])
    narrow_head = EagerTensor(torch.zeros(16, 4), "head.weight", "toy.safetensors")
    with pytest.raises(ShapeMismatchError, match=r"tensor 'head.weight' in toy.safetensors: expected shape "
                                                 r"\(16, 8\), found \(16, 4\)"):
        model.load_weights([("head.weight", narrow_head)])


@pytest.mark.parametrize(("field", "value"), [("vocab_size", None), ("hidden_size", "8"), ("hidden_size", 0)])
def test_toy_model_names_a_bad_config_field(toymodel_source, field, value):
    from loader_plugin_toymodel.model import ToyForCausalLM

    with pytest.raises(ConfigError, match=f"config.json field '{field}': expected a positive integer"):
        ToyForCausalLM(ModelContext(hf_config=_toy_config(**{field: value}), dtype=torch.float32))


# --- installed with pip, used from fresh processes ------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install`` the fixture into a private folder; returns the environment that sees it."""
    root = tmp_path_factory.mktemp("toymodel-install")
    target = root / "site"
    # The build backend comes from requirements-test.txt (as in every tox env), so the build needs no network.
    assert importlib.util.find_spec("hatchling") is not None, "hatchling (requirements-test.txt) is not installed"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--no-build-isolation",
               "--disable-pip-version-check", "--quiet", "--target", str(target), str(FIXTURE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail(f"pip install of the fixture failed:\n{done.stdout}\n{done.stderr}")
    assert not (FIXTURE / "build").exists(), "building must not leave files in the fixture"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), *sys.path]),
        "LOADER_CACHE_DIR": str(root / "cache"),
        "LOADER_PLUGINS": "toymodel,safetensors",  # the other model plugins are not under test here
    }
    env.pop("LOADER_DISABLE_PLUGINS", None)
    yield env
    shutil.rmtree(target, ignore_errors=True)


def _loader_command(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("loader")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "import sys; from loader._cli.main import main; sys.exit(main())", *args]


@pytest.mark.slow
def test_installed_plugin_is_listed_by_loader_models(installed):
    done = subprocess.run(_loader_command("models", "--json"), env=installed, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    rows = {row["architecture"]: row for row in json.loads(done.stdout)}
    assert list(rows) == ["ToyForCausalLM"]
    toy = rows["ToyForCausalLM"]
    assert (toy["plugin"], toy["class_path"]) == ("toymodel", CLASS_PATH)
    assert toy["is_text_generation_model"] is True and toy["supports_tensor_parallel"] is False

    check = textwrap.dedent("""
        import json, sys
        from loader._plugins import create_plugin_host
        from loader._registry import ModelRegistry
        host = create_plugin_host()
        record = host.records["toymodel"]
        registry = ModelRegistry.from_host(host)
        info = registry.model_info("ToyForCausalLM")
        print(json.dumps({"status": record.status, "distribution": record.distribution, "hooks": record.hooks,
                          "info": info.to_json(), "imported": "loader_plugin_toymodel.model" in sys.modules}))
    """)
    done = subprocess.run([sys.executable, "-c", check], env=installed, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["status"] == "loaded" and seen["distribution"] == "loader-plugin-toymodel"
    assert seen["hooks"] == ["loader_register_architectures"]
    assert seen["info"]["is_text_generation_model"] is True
    assert seen["imported"] is False, "model_info must not import the model module in the asking process"


LOAD = """
import json, sys
import torch
import loader
from loader.errors import UnexpectedWeightError
model = loader.load_model(sys.argv[1], dtype="float32")
ids = torch.tensor([[0, 3, 15, 7]])
expected = torch.load(sys.argv[3])
error = (model(ids) - expected).abs().max().item()
try:
    loader.load_model(sys.argv[2], dtype="float32")
    unexpected = None
except UnexpectedWeightError as exc:
    unexpected = str(exc)
print(json.dumps({"class": type(model).__name__, "max_error": error, "unexpected": unexpected}))
"""


@pytest.mark.slow
def test_installed_plugin_loads_a_safetensors_checkpoint(installed, tmp_path):
    import safetensors.torch as safetensors_torch

    # The child loads through the installed safetensors format plugin: it must be there and stream weights.
    record = create_plugin_host().records["safetensors"]
    assert record.status == "loaded" and "loader_iter_weights" in record.hooks, record
    torch.manual_seed(0)
    embed, head = torch.randn(16, 8), torch.randn(16, 8)
    good, extra = tmp_path / "good", tmp_path / "extra"
    both = {"embed.weight": embed, "head.weight": head}
    for folder, tensors in [(good, both), (extra, {**both, "norm.weight": torch.ones(8)})]:
        folder.mkdir()
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(_toy_config()))
    ids = torch.tensor([[0, 3, 15, 7]])
    torch.save(embed[ids] @ head.T, tmp_path / "expected.pt")

    done = subprocess.run([sys.executable, "-c", LOAD, str(good), str(extra), str(tmp_path / "expected.pt")],
                          env=installed, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["class"] == "ToyForCausalLM"
    assert result["max_error"] < 1e-5
    assert result["unexpected"] is not None and "'norm.weight'" in result["unexpected"]
    assert "model.safetensors" in result["unexpected"]
