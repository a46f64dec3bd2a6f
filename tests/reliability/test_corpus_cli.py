"""The whole corpus through ``loader load``: exit code 2, one ``error:`` line naming the culprit, no traceback.

Most cases run the CLI in-process (``loader._cli.main.main``) to keep the suite
fast; a few run ``python -m loader._cli.main`` for real, so the console path
(interpreter start, plugin discovery, exit status) is covered too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loader._cli.main import main
from tests.reliability import (
    test_bounded_resources,
    test_corpus_bnb,
    test_corpus_config,
    test_corpus_contract,
    test_corpus_gguf,
    test_corpus_pickle,
    test_corpus_safetensors,
    test_gguf_layout,
    test_hub_cache,
)
from tests.reliability.corpus import CorpusCase, case_params, check_built

ALL_CASES: list[CorpusCase] = [
    *test_corpus_safetensors.CASES,
    *test_corpus_config.CASES,
    *test_corpus_pickle.CASES,
    *test_corpus_gguf.CASES,
    *test_corpus_bnb.CASES,
    *test_corpus_contract.CASES,
    *test_hub_cache.CASES,
    *test_gguf_layout.CASES,
    *test_bounded_resources.CASES,
]

SUBPROCESS_CASES = ("truncated-mid-tensor", "hidden-size-not-integer", "bin-runs-code-zip", "gguf-wrong-magic",
                    "bnb-missing-absmax")


def _assert_one_line_error(stderr: str) -> str:
    assert stderr.startswith("error: "), stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    return stderr.removeprefix("error: ").rstrip("\n")


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", case_params(ALL_CASES))
def test_cli_load_prints_one_line_and_exits_2(case: CorpusCase, tmp_path: Path, capsys) -> None:
    built = case.build(tmp_path)
    code = main(["load", str(built.source), "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    check_built(built, _assert_one_line_error(err))


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_cli_in_a_real_process(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in ALL_CASES if c.id == case_id)
    built = case.build(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "loader._cli.main", "load", str(built.source)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    check_built(built, _assert_one_line_error(done.stderr))
