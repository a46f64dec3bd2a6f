"""scripts/external_envs.py: an external-library env is due when an input changed or its last pass is old."""

from __future__ import annotations

import datetime
from pathlib import Path

from scripts.external_envs import MAX_AGE_DAYS, due, external_envs, inputs

TOX = """
[tox]
env_list = marlin
[testenv:marlin]
commands = pytest tests/plugins/marlin --ignore=tests/plugins/marlin/test_library.py
[testenv:marlin-library]
labels = external
deps =
    torch==2.13.0
    library
commands_pre = {[wheels]install} llama marlin
commands = pytest -q tests/plugins/marlin/test_library.py {posargs}
"""
FILES = {
    "tox.ini": TOX,
    "constraints.txt": "# pins\ntorch==2.13.0\nlibrary==1.2.3\nunrelated==4\n",
    "plugins/marlin/src/loader_plugin_marlin/plugin.py": "x = 1\n",
    "plugins/llama/src/loader_plugin_llama/plugin.py": "y = 1\n",
    "core/loader/__init__.py": "z = 1\n",
    "tests/conftest.py": "",
    "tests/plugins/marlin/test_library.py": "from tests.helpers.library_checkpoints import write\n",
    "tests/plugins/marlin/test_other.py": "",
    "tests/helpers/library_checkpoints.py": "from tests.helpers import shared\n",
    "tests/helpers/shared.py": "",
    "tests/helpers/unused.py": "",
}
TODAY = datetime.date(2026, 12, 3)


def repo(root: Path) -> Path:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_inputs_are_its_plugins_tests_helpers_pins_and_section(tmp_path: Path) -> None:
    root = repo(tmp_path)
    envs = external_envs(root)
    assert list(envs) == ["marlin-library"]
    found = inputs(root, envs["marlin-library"])
    assert sorted(found) == sorted([
        "tox.ini [testenv:marlin-library]", "plugins/llama", "plugins/marlin", "tests/conftest.py",
        "tests/helpers/library_checkpoints.py", "tests/helpers/shared.py", "tests/plugins/marlin/test_library.py",
        "pin torch", "pin library"])
    assert found["pin library"] == "library==1.2.3"


def test_due_when_an_input_changed_or_the_pass_is_old(tmp_path: Path) -> None:
    root = repo(tmp_path)
    env = external_envs(root)["marlin-library"]
    assert due(root, env.name, env, {}, TODAY) == "no record of a pass in .ci/external-checked"
    record = {env.name: {"passed": TODAY.isoformat(), "inputs": inputs(root, env)}}
    assert due(root, env.name, env, record, TODAY) is None

    (root / "core" / "loader" / "__init__.py").write_text("z = 2\n")  # the core: only the age catches it
    (root / "tests" / "helpers" / "unused.py").write_text("w = 2\n")
    (root / "tests" / "plugins" / "marlin" / "test_other.py").write_text("w = 2\n")
    assert due(root, env.name, env, record, TODAY + datetime.timedelta(days=MAX_AGE_DAYS)) is None
    assert due(root, env.name, env, record, TODAY + datetime.timedelta(days=MAX_AGE_DAYS + 1)) == (
        f"it last passed on {TODAY}, {MAX_AGE_DAYS + 1} days ago (more than {MAX_AGE_DAYS})")

    (root / "tests" / "helpers" / "shared.py").write_text("v = 2\n")
    assert due(root, env.name, env, record, TODAY) == f"tests/helpers/shared.py changed since it passed on {TODAY}"
    (root / "constraints.txt").write_text(FILES["constraints.txt"].replace("1.2.3", "1.3"))
    (root / "plugins" / "marlin" / "src" / "loader_plugin_marlin" / "new.py").write_text("")
    assert due(root, env.name, env, record, TODAY) == (
        f"pin library, plugins/marlin, tests/helpers/shared.py changed since it passed on {TODAY}")
