"""The probe child: model info without importing the model (or touching CUDA) in this process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from loader._registry import ModelInfo, ModelRegistry
from loader._registry import probe as probe_module
from loader.errors import ConfigError, PluginError
from tests.helpers.toy_models import TOY_WITH_TORCH, TOY_WITHOUT_TORCH


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADER_PROBE_IN_PROCESS", raising=False)
    monkeypatch.delenv("LOADER_PROBE_TIMEOUT", raising=False)






def test_probe_in_a_child_never_imports_the_model_or_initialises_cuda(toys, children, monkeypatch):
    import torch

    def cuda_init_fails(*args, **kwargs):
        raise RuntimeError("CUDA must not be initialised in the parent")

    monkeypatch.setattr(torch.cuda, "init", cuda_init_fails)
    monkeypatch.setattr(torch.cuda, "_lazy_init", cuda_init_fails)
    module = toys(TOY_WITH_TORCH)
    registry = ModelRegistry()
    registry.register("TorchToyForCausalLM", f"{module}:TorchToyForCausalLM", plugin="toy")

    info = registry.model_info("TorchToyForCausalLM")

    assert info == ModelInfo(architecture="TorchToyForCausalLM", is_text_generation_model=True,
                             supports_pipeline_parallel=True)
    assert len(children) == 1 and children[0][1:4] == ["-m", "loader._registry", "probe"]
    assert module not in sys.modules
    assert not torch.cuda.is_initialized()


def test_all_unknown_architectures_go_to_one_child(toys, children):
    first, second = toys(TOY_WITHOUT_TORCH), toys(TOY_WITHOUT_TORCH)
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{first}:ToyForCausalLM", plugin="toy")
    registry.register("PlainModel", f"{first}:PlainModel", plugin="toy")
    registry.register("OtherToyForCausalLM", f"{second}:ToyForCausalLM", plugin="other")

    infos = registry.model_infos()

    assert sorted(infos) == ["OtherToyForCausalLM", "PlainModel", "ToyForCausalLM"]
    assert infos["ToyForCausalLM"].packed_modules() == {
        "gate_up_proj": ["gate_proj", "up_proj"], "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    }
    assert infos["PlainModel"] == ModelInfo(architecture="PlainModel")
    assert len(children) == 1
    assert f"OtherToyForCausalLM={second}:ToyForCausalLM" in children[0]
    assert first not in sys.modules and second not in sys.modules
    registry.model_infos()
    assert len(children) == 1, "answers are kept in memory"


def test_child_hides_cuda_and_sends_stray_prints_to_stderr(toys, children):
    module = toys("""
        import atexit, os
        print("stray print while importing")
        os.write(1, b"stray C-level write\\n")
        atexit.register(print, "stray print at exit")

        class Probe:
            # the flag reports what the child saw, so the test can read it back
            supports_tensor_parallel = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    """)
    registry = ModelRegistry()
    registry.register("Probe", f"{module}:Probe", plugin="toy")
    assert registry.model_info("Probe").supports_tensor_parallel is True


def test_one_broken_class_does_not_hide_the_others(toys, children):
    good = toys(TOY_WITHOUT_TORCH)
    bad = toys("raise ImportError('needs a library that is not installed')")
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{good}:ToyForCausalLM", plugin="good")
    registry.register("BrokenForCausalLM", f"{bad}:Broken", plugin="bad")

    outcomes = registry.model_infos_or_errors()

    assert isinstance(outcomes["ToyForCausalLM"], ModelInfo)
    error = outcomes["BrokenForCausalLM"]
    assert isinstance(error, PluginError)
    assert "plugin 'bad'" in str(error) and "'BrokenForCausalLM'" in str(error)
    assert "ImportError: needs a library that is not installed" in str(error)
    with pytest.raises(PluginError, match="BrokenForCausalLM"):
        registry.model_infos()
    assert len(children) == 2, "the failed one is probed again"
    assert children[1][4:] == [f"BrokenForCausalLM={bad}:Broken"], "the good one is not"
    assert registry.model_info("ToyForCausalLM").supports_quantization
    assert len(children) == 2


def test_malformed_capability_in_the_child_names_the_architecture(toys):
    module = toys("class Bad:\n    supports_quantization = 'sometimes'\n")
    registry = ModelRegistry()
    registry.register("BadForCausalLM", f"{module}:Bad", plugin="toy")
    expected = r"'BadForCausalLM'.*Bad.supports_quantization: expected True or False"
    with pytest.raises(PluginError, match=expected):
        registry.model_info("BadForCausalLM")


def test_crashing_child_is_reported_with_its_stderr(toys):
    module = toys("""
        import os, sys
        sys.stderr.write("fatal: the model module exploded\\n")
        sys.stderr.flush()
        os._exit(7)
    """)
    registry = ModelRegistry()
    registry.register("CrashForCausalLM", f"{module}:Crash", plugin="crashy")
    with pytest.raises(PluginError) as err:
        registry.model_info("CrashForCausalLM")
    message = str(err.value)
    assert "'CrashForCausalLM'" in message and "plugin 'crashy'" in message
    assert "exit status 7" in message and "fatal: the model module exploded" in message
    assert module not in sys.modules


def test_hanging_child_times_out(toys, monkeypatch):
    monkeypatch.setenv("LOADER_PROBE_TIMEOUT", "2")
    module = toys("""
        import sys, time
        sys.stderr.write("loading forever\\n")
        sys.stderr.flush()
        time.sleep(60)
    """)
    registry = ModelRegistry()
    registry.register("HangForCausalLM", f"{module}:Hang", plugin="slow")
    started = time.monotonic()
    with pytest.raises(PluginError, match=r"'HangForCausalLM'.*did not finish within 2 s.*loading forever"):
        registry.model_info("HangForCausalLM")
    assert time.monotonic() - started < 20


def test_garbage_on_stdout_is_reported(monkeypatch):
    monkeypatch.setattr(probe_module, "child_command",
                        lambda entries: [sys.executable, "-c", "print('Segmentation fault?')"])
    registry = ModelRegistry()
    registry.register("GarbageForCausalLM", "regtoy_garbage.model:Garbage", plugin="noisy")
    with pytest.raises(PluginError, match=r"'GarbageForCausalLM'.*printed 'Segmentation fault\?\\n', not the "
                                          r"expected JSON"):
        registry.model_info("GarbageForCausalLM")


def test_child_answering_for_other_architectures_is_reported(monkeypatch):
    answer = '{"infos": {}, "errors": {}}'
    monkeypatch.setattr(probe_module, "child_command",
                        lambda entries: [sys.executable, "-c", f"print({answer!r})"])
    registry = ModelRegistry()
    registry.register("SilentForCausalLM", "regtoy_silent.model:Silent", plugin="quiet")
    with pytest.raises(PluginError, match=r"'SilentForCausalLM'.*the probe child gave no answer"):
        registry.model_info("SilentForCausalLM")


def test_in_process_opt_out_imports_here(toys, monkeypatch):
    monkeypatch.setenv("LOADER_PROBE_IN_PROCESS", "1")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no child expected"))
    module = toys(TOY_WITHOUT_TORCH)
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{module}:ToyForCausalLM", plugin="toy")
    assert registry.model_info("ToyForCausalLM").tied_embeddings_supported
    assert module in sys.modules


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_bad_probe_timeout_is_a_config_error(value):
    with pytest.raises(ConfigError, match=f"LOADER_PROBE_TIMEOUT='{value}': expected a positive number"):
        probe_module.probe_timeout({"LOADER_PROBE_TIMEOUT": value})


def test_probe_timeout_default_and_override():
    assert probe_module.probe_timeout({}) == 120
    assert probe_module.probe_timeout({"LOADER_PROBE_TIMEOUT": "2.5"}) == 2.5


def test_probe_command_line_prints_json_and_rejects_bad_usage(toys):
    module = toys(TOY_WITHOUT_TORCH)
    env = probe_module.child_environment()
    done = subprocess.run([sys.executable, "-m", "loader._registry", "probe", f"Toy={module}:ToyForCausalLM",
                           f"Missing={module}:Nope"], env=env, capture_output=True, text=True, check=True)
    import json

    answer = json.loads(done.stdout)
    assert answer["infos"]["Toy"]["supports_tensor_parallel"] is True
    assert "has no attribute 'Nope'" in answer["errors"]["Missing"]
    bad = subprocess.run([sys.executable, "-m", "loader._registry", "probe", "no-equals-sign"],
                         env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "usage: python -m loader._registry probe" in bad.stderr
