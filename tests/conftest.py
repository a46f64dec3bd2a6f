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
