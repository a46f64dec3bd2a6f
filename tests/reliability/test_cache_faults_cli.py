"""``loader load`` / ``generate`` / ``models`` with the cache folder somewhere nothing can be written.

Each variable that can place the caches — ``HOME`` (the user cache folder is ``~/.cache/loader``),
``XDG_CACHE_HOME`` and ``LOADER_CACHE_DIR`` — pointing at a path under a regular file or at a read-only
mount: the command does its work without the caches (compiled helpers, probe results, packed-weights
bundles) and says so in exactly one ``warning:`` line on stderr, naming the folder. ``load`` runs under
each variable; ``generate`` (the same load, then tokens) and ``models`` (a probe of every architecture,
seconds each run once the cache cannot keep it) under one each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.reliability.cache_mounts import remount_read_only, tmpfs

_CACHE_VARIABLES = ("HOME", "XDG_CACHE_HOME", "LOADER_CACHE_DIR")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    return write_gguf(tmp_path_factory.mktemp("cli-cache") / "m.gguf", model, "llama", qtype=Q.Q4_1)


@pytest.fixture
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a command whose caches cannot be written, by way of one variable."""
    env = {k: v for k, v in os.environ.items() if k not in _CACHE_VARIABLES}
    env.update({"HOME": str(tmp_path / "home"), "LOADER_GGUF_PACKED_CACHE": "1", "OMP_NUM_THREADS": "1"})
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    if request.param == "HOME":
        env["HOME"] = str(blocker)
        yield env
    elif request.param == "XDG_CACHE_HOME":
        env["XDG_CACHE_HOME"] = str(blocker / "cache")
        yield env
    else:
        with tmpfs(tmp_path / "read-only"):
            remount_read_only(tmp_path / "read-only")
            env["LOADER_CACHE_DIR"] = str(tmp_path / "read-only" / "loader")
            yield env


def _run(env: dict[str, str], *args: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-m", "loader._cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def _assert_said_once(stderr: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("warning: cannot write the cache folder "), stderr
    assert "going on without caching there" in lines[0]


@pytest.mark.parametrize("unwritable", _CACHE_VARIABLES, indirect=True)
def test_load_works_without_a_cache_and_says_so_once(gguf, unwritable) -> None:
    stdout, stderr = _run(unwritable, "load", str(gguf), "--json")
    _assert_said_once(stderr)
    quantization = json.loads(stdout)["quantization"]
    assert quantization["packing"].startswith("torch: ")
    assert not quantization["packed_cache"]["written"] and "not written" in quantization["packed_cache"]["notes"][0]


@pytest.mark.parametrize("unwritable", ["HOME"], indirect=True)
def test_generate_works_without_a_cache_and_says_so_once(gguf, unwritable) -> None:
    stdout, stderr = _run(unwritable, "generate", str(gguf), "--prompt", "hello", "--max-new-tokens", "2", "--json")
    _assert_said_once(stderr)
    assert 1 <= len(json.loads(stdout)["output_ids"]) <= 2


@pytest.mark.parametrize("unwritable", ["LOADER_CACHE_DIR"], indirect=True)
def test_models_works_without_a_cache_and_says_so_once(unwritable) -> None:
    stdout, stderr = _run(unwritable, "models", "--json")
    _assert_said_once(stderr)
    rows = json.loads(stdout)
    assert rows and not [row for row in rows if "error" in row]
