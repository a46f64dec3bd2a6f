"""Suite-wide settings: the caches live in a temp folder, never the user's (GGUF's packed-weights bundle
off); a wheel env (``LOADER_TESTS_FROM_WHEELS=1``, set by tox) refuses to run while loader or a plugin would
come from anywhere but its installed wheel."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("LOADER_TESTS_FROM_WHEELS") != "1":
        return
    from tests.helpers.installed_packages import not_from_wheels

    problems = not_from_wheels()
    if problems:
        raise pytest.UsageError(
            "LOADER_TESTS_FROM_WHEELS=1, but these would not be tested as installed from their wheels: "
            f"{'; '.join(problems)} (install with scripts/install_wheels.py; no editable installs, no PYTHONPATH)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test to run is no failure: a place whose tests all skip at import (an external-library env without its
    library, ``-k`` matching nothing) exits 0, not pytest's 5. That each test runs somewhere is checked by
    scripts/test_places.py, not by this status."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_report_header(config: pytest.Config) -> str:
    from tests.helpers.installed_packages import import_locations, site_packages

    found = [path for path in import_locations().values() if path is not None]
    installed = [path for path in found if any(path.is_relative_to(folder) for folder in site_packages())]
    return (f"loader and its plugins: {len(found)} packages, {len(installed)} from installed wheels, "
            f"{len(found) - len(installed)} from elsewhere (editable or on sys.path)")


@pytest.fixture(autouse=True, scope="session")
def _isolated_loader_cache() -> Iterator[None]:
    """Every cache in a temp folder; GGUF's and marlin's packed-weights bundles off, so that every packing test
    packs (a second load of a file would otherwise map what the first packed: tests/plugins/gguf/packed/
    test_bundle_keys.py and tests/plugins/marlin/test_packed_cache.py turn them on); quantized layers plan their
    kernel paths by the static rule, not by timings of this machine (deterministic: tests/core/test_kernel_paths.py
    turns timing on); float32 loads of packed-integer layers compute in float32 (every reference these tests
    compare with is exact float32 arithmetic on the dequantized weight: tests/plugins/marlin/test_kernel_paths.py
    checks the default bfloat16-cast path and its tolerance)."""
    bundles = ("LOADER_GGUF_PACKED_CACHE", "LOADER_MARLIN_PACKED_CACHE")
    names = ("LOADER_CACHE_DIR", *bundles, "LOADER_KERNEL_MEASURE", "LOADER_KERNEL_EXACT_FLOAT32")
    previous = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="loader-test-cache-") as folder:
        os.environ["LOADER_CACHE_DIR"] = folder
        for name in bundles:
            os.environ[name] = "0"
        os.environ["LOADER_KERNEL_MEASURE"] = "0"
        os.environ["LOADER_KERNEL_EXACT_FLOAT32"] = "1"
        try:
            yield
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


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


@pytest.fixture(params=["native", "torch"])
def packing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a packing test with the compiled helpers (:mod:`loader.kernels.native_packing`) and with torch
    alone (``LOADER_NATIVE_REPACK=0``): both must write the bytes the test expects."""
    from loader.kernels import native_repack

    if request.param == "torch":
        monkeypatch.setenv("LOADER_NATIVE_REPACK", "0")
    native_repack.cache_clear()
    if request.param == "native" and native_repack() is None:
        from loader.kernels import native_repack_unavailable_reason

        pytest.skip(f"no compiled packing helpers here: {native_repack_unavailable_reason()}")
    try:
        yield str(request.param)
    finally:
        native_repack.cache_clear()
