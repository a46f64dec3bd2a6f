"""The corpus's shape: a case builds one bad checkpoint and says how the load must fail.

Every ``test_corpus_*`` module lists its :class:`CorpusCase` objects in
``CASES`` and runs them through :func:`assert_load_refused` (``loader.load_model``);
:mod:`.test_corpus_cli` runs the union of all lists through the CLI. A case's
``build`` writes into a fresh folder and returns a :class:`Built` that names
the source to load, the fragments its message must contain (file, tensor,
field), and optionally a marker file that must never appear (code execution)
and a file outside the model folder that must never be opened.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

from loader.errors import LoadError

__all__ = ["Built", "CorpusCase", "assert_load_refused", "case_params", "check_built", "recording_opens"]


@attrs.frozen
class Built:
    """What a case wrote: the source to load and what its failure must show."""

    source: Path
    fragments: tuple[str, ...]
    marker: Path | None = None
    outside: Path | None = None


@attrs.frozen
class CorpusCase:
    """One malformed input: ``build(folder) -> Built`` and the :class:`LoadError` subclass it must raise.

    ``known_bug`` (a reason) marks a case the loader still gets wrong: a strict xfail until fixed.
    """

    id: str
    build: Callable[[Path], Built]
    error: type[LoadError]
    known_bug: str | None = None


def case_params(cases: list[CorpusCase]) -> list[Any]:
    """``pytest.param`` per case, id'd by name; a case with a ``known_bug`` is a strict xfail."""
    return [
        pytest.param(case, id=case.id,
                     marks=[pytest.mark.xfail(reason=case.known_bug, strict=True)] if case.known_bug else [])
        for case in cases
    ]


@contextmanager
def recording_opens() -> Iterator[list[str]]:
    """Record every path opened through ``os.open`` or ``open`` (resolved) while active."""
    opened: list[str] = []
    real_os_open, real_open, real_io_open = os.open, builtins.open, io.open

    def note(target: Any) -> None:
        if isinstance(target, str | bytes | os.PathLike):
            opened.append(os.path.realpath(os.fsdecode(target)))

    def os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        note(path)
        return real_os_open(path, *args, **kwargs)

    def py_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        note(file)
        return real_open(file, *args, **kwargs)

    os.open, builtins.open, io.open = os_open, py_open, py_open  # type: ignore[assignment]
    try:
        yield opened
    finally:
        os.open, builtins.open, io.open = real_os_open, real_open, real_io_open  # type: ignore[assignment]


def check_built(built: Built, message: str, opened: list[str] | None = None) -> None:
    """The guarantees that hold whichever way the failure was reported."""
    for fragment in built.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if built.marker is not None:
        assert not built.marker.exists(), "the checkpoint ran code"
    if built.outside is not None and opened is not None:
        assert os.path.realpath(built.outside) not in opened, "a file outside the model folder was opened"


def assert_load_refused(case: CorpusCase, folder: Path) -> LoadError:
    """Build ``case`` in ``folder``; ``load_model`` must raise ``case.error`` naming the culprit."""
    import loader

    built = case.build(folder)
    with recording_opens() as opened, pytest.raises(LoadError) as info:
        loader.load_model(str(built.source), dtype="float32")
    error = info.value
    assert isinstance(error, case.error), f"expected {case.error.__name__}, got {type(error).__name__}: {error}"
    check_built(built, str(error), opened)
    return error
