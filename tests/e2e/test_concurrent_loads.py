"""Real models loaded in two threads at once equal the same loads made one after the other.

The core's test (``tests/core/test_concurrent_loads.py``) forces the builds to
overlap; this one runs the whole pipeline of two plugins' models (mapping,
population, registry) side by side with nothing forced, several times.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

import loader
from tests.helpers.hf_checkpoints import save_checkpoint

LOADS = {"llama": "bfloat16", "qwen2": "float16"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = {}
    for family in LOADS:
        found[family] = tmp_path_factory.mktemp(family)
        save_checkpoint(family, found[family])
    return found


def _load(folder: Path, family: str, ids: torch.Tensor, results: dict[str, torch.Tensor],
          errors: list[BaseException]) -> None:
    try:
        results[family] = loader.load_model(str(folder), dtype=LOADS[family])(ids)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_llama_and_qwen_in_two_threads_equal_sequential_loads(folders: dict[str, Path]) -> None:
    ids = torch.tensor([[1, 7, 42, 255, 3]])
    expected = {family: loader.load_model(str(folders[family]), dtype=dtype)(ids)
                for family, dtype in LOADS.items()}
    before = torch.get_default_dtype()
    for _ in range(3):
        results: dict[str, torch.Tensor] = {}
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_load, args=(folders[family], family, ids, results, errors))
                   for family in LOADS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        for family in LOADS:
            assert torch.equal(results[family], expected[family]), family
        assert torch.get_default_dtype() == before
