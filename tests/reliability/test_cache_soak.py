"""The cache races, twenty rounds in a row (``make soak``): for each on-disk cache, two and eight processes
doing the first load at once, and a writer killed mid-write followed by a fresh load.

The scenarios are the tests of ``test_cache_faults_{probe,native,bundle}.py`` (which the normal suite runs
once each); a round is one test per scenario, each in a cache folder of its own, so a failure names its
round and scenario and every test stays under the reliability suite's time limit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loader import _cache_root
from tests.reliability import test_cache_faults_bundle as bundle
from tests.reliability import test_cache_faults_native as native
from tests.reliability import test_cache_faults_probe as probe
from tests.reliability.test_cache_faults_probe import toy  # noqa: F401 - the probe scenarios' fixture
from tests.reliability.test_truncation_race import SOAK_ENV

ROUNDS = 20

Scenario = Callable[[Any, tuple[Path, str], Path], None]
SCENARIOS: dict[str, Scenario] = {
    "probe-2": lambda package, gguf, tmp: probe.test_processes_probing_at_once_all_answer_and_leave_one_whole_entry(
        package, tmp, 2),
    "probe-8": lambda package, gguf, tmp: probe.test_processes_probing_at_once_all_answer_and_leave_one_whole_entry(
        package, tmp, 8),
    "probe-killed": lambda package, gguf, tmp:
        probe.test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_probe_ignores(package, tmp),
    "native-2": lambda package, gguf, tmp:
        native.test_processes_building_at_once_all_load_and_leave_one_whole_library_each(gguf, tmp, 2),
    "native-8": lambda package, gguf, tmp:
        native.test_processes_building_at_once_all_load_and_leave_one_whole_library_each(gguf, tmp, 8),
    "native-killed": lambda package, gguf, tmp:
        native.test_a_build_killed_mid_write_leaves_scratch_the_next_load_ignores(gguf, tmp),
    "bundle-2": lambda package, gguf, tmp: bundle.test_processes_packing_at_once_all_load_and_leave_one_whole_bundle(
        gguf, tmp, 2),
    "bundle-8": lambda package, gguf, tmp: bundle.test_processes_packing_at_once_all_load_and_leave_one_whole_bundle(
        gguf, tmp, 8),
    "bundle-killed": lambda package, gguf, tmp:
        bundle.test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_load_ignores(gguf, tmp),
}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny GGUF both the native and the bundle scenarios load, and its weights packed without caches."""
    path = bundle._write(tmp_path_factory.mktemp("soak") / "m.gguf", seed=0)
    return path, bundle._unbundled_digest(path)


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get(SOAK_ENV) != "1", reason=f"the cache races soak with {SOAK_ENV}=1 (make soak)")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("round_", range(1, ROUNDS + 1))
def test_cache_races_pass_round_after_round(toy, gguf, tmp_path, monkeypatch, round_, scenario) -> None:  # noqa: F811
    monkeypatch.setattr(_cache_root, "_warned", False)
    SCENARIOS[scenario](toy, gguf, tmp_path)
