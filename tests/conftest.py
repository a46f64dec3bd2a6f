"""Suite-wide settings: the capability cache lives in a temp folder, never the user's cache."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_loader_cache() -> Iterator[None]:
    previous = os.environ.get("LOADER_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="loader-test-cache-") as folder:
        os.environ["LOADER_CACHE_DIR"] = folder
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("LOADER_CACHE_DIR", None)
            else:
                os.environ["LOADER_CACHE_DIR"] = previous


@pytest.fixture
def toys(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Write toy model modules under unique names on ``sys.path`` (probe children inherit it); forget them after."""
    import uuid

    from tests.helpers.toy_models import forget_module, write_module

    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(source: str) -> str:
        name = f"toy_{uuid.uuid4().hex[:12]}"
        write_module(tmp_path, name, source)
        written.append(name)
        return name

    yield write
    for name in written:
        forget_module(name)


@pytest.fixture
def children(monkeypatch):  # type: ignore[no-untyped-def]
    """Record every ``subprocess.run`` command (each is one registry probe child)."""
    import subprocess

    commands: list[list[str]] = []
    real_run = subprocess.run

    def run(command, *args, **kwargs):  # type: ignore[no-untyped-def]
        commands.append(list(command))
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    return commands
