"""docs/plugin-authoring.md's walkthrough, run as written: the template becomes a plugin that loads a checkpoint.

The fenced ``bash`` and ``python`` blocks of the page's section "From the
template to a loaded checkpoint" are run in order, as one bash script, in a
fresh environment layered over this one (``tests/helpers/layered_venv.py``) with
``LOADER_REPO`` set as the page asks: copy ``plugins/_template`` and rename it,
build the wheel, install it, ``loader plugins``, run its test, re-save a
checkpoint written by ``transformers`` as ``.npz`` and load it. Then this test
checks what the page promises: the installed wheel is listed as loaded with its
hooks, no trace of the template's name is left, and the loaded model's logits
match ``transformers``.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

from scripts.distributions import shipped_distributions
from scripts.plugin_list import plugins
from tests.helpers.hf_checkpoints import reference_logits, save_checkpoint
from tests.helpers.layered_venv import REPO, create_layered_venv

PAGE = REPO / "docs" / "plugin-authoring.md"
SECTION = "## From the template to a loaded checkpoint"
FENCED = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)


def walkthrough_script() -> str:
    """The section's code blocks as one bash script; a Python block runs as ``python -`` with the block on stdin."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + len(SECTION))
    lines = ["set -euo pipefail"]
    for language, code in FENCED.findall(text[start:end]):
        lines.append(code if language == "bash" else f"python - <<'PYTHON_BLOCK'\n{code}PYTHON_BLOCK\n")
    return "\n".join(lines)


def test_the_walkthrough_has_every_step_in_order():
    script = walkthrough_script()
    steps = ["cp -r \"$LOADER_REPO/plugins/_template\"", "mv src/loader_plugin_template", "pip wheel",
             "pip install dist/", "loader plugins", "pytest", "numpy.savez", "loader load"]
    positions = [script.find(step) for step in steps]
    assert -1 not in positions, dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions)


def test_the_template_is_not_a_shipped_plugin():
    """Nothing lists it: not the distributions built and tested (the Makefile's PLUGINS follows the same rule),
    not the plugin lists of README, tox.ini, mkdocs.yml and the core."""
    assert "loader-plugin-template" not in {d.name for d in shipped_distributions()}
    assert "template" not in {p.name for p in plugins()}
    assert "plugins/_%" in (REPO / "Makefile").read_text(encoding="utf-8")


COMPARE = """
import json, sys
import torch
import loader
model, report = loader.load_model_with_report("tiny-llama-npz", dtype="float32")
ids = torch.load(sys.argv[1])
error = (model(ids) - torch.load(sys.argv[2])).abs().max().item()
print(json.dumps({"format": report.load_format, "class": type(model).__name__, "max_error": error}))
"""


@pytest.mark.slow
def test_following_the_page_builds_a_working_format_plugin(tmp_path):
    env = create_layered_venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    hf_model = save_checkpoint("llama", work / "tiny-llama")
    ids = torch.tensor([[0, 5, 17, 3, 200, 9, 42]])
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(reference_logits(hf_model, ids), tmp_path / "expected.pt")

    done = subprocess.run(["bash", "-c", walkthrough_script()], cwd=work, env={**env.env, "LOADER_REPO": str(REPO)},
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert re.search(r"^npz\s+loader-plugin-npz\s+0\.1\.0\s+loaded\s+detect_format, iter_weights\s*$",
                     done.stdout, re.M), done.stdout
    assert re.search(r"^loaded LlamaForCausalLM from .*tiny-llama-npz \(npz, 1 files\)$", done.stdout, re.M)

    plugin = work / "loader-plugin-npz"
    leftovers = [str(p) for p in plugin.rglob("*") if "__pycache__" not in p.parts
                 and ("template" in p.name or (p.is_file() and b"loader_plugin_template" in p.read_bytes()))]
    assert not leftovers, leftovers
    assert (env.site_packages / "loader_plugin_npz" / "hooks.py").is_file(), "installed from the wheel, not linked"

    listed = subprocess.run(["loader", "plugins", "--json"], cwd=work, env=env.env, capture_output=True,
                            text=True, timeout=300, check=True)
    record = next(r for r in json.loads(listed.stdout) if r["name"] == "npz")
    assert (record["distribution"], record["status"]) == ("loader-plugin-npz", "loaded")
    assert sorted(record["hooks"]) == ["loader_detect_format", "loader_iter_weights"]

    compared = subprocess.run([str(env.python), "-c", COMPARE, str(tmp_path / "ids.pt"),
                               str(tmp_path / "expected.pt")], cwd=work, env=env.env, capture_output=True,
                              text=True, timeout=300, check=False)
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout.strip().splitlines()[-1])
    assert (result["format"], result["class"]) == ("npz", "LlamaForCausalLM")
    assert result["max_error"] < 1e-4
