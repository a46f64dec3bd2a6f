"""Reliability suite settings: the fuzzing profile and a per-test time limit.

The ``loader-fuzz`` hypothesis profile is what every ``test_fuzz_*`` harness
runs under: a fixed seed (``derandomize=True``), no example database, a
deadline per example (a parser that hangs or crawls fails), and
``max_examples`` from ``LOADER_FUZZ_EXAMPLES`` (default 200) so a longer local
run is one environment variable away, and ``LOADER_FUZZ_RANDOM=1`` to explore
new inputs instead of CI's fixed sequence (see docs/reliability.md). Harnesses
apply it with ``@settings(parent=settings.get_profile(FUZZ_PROFILE))``; it is not
loaded globally, so other suites keep their own hypothesis settings.

Every test here also runs under an alarm (``LOADER_RELIABILITY_TIMEOUT``
seconds, default 60): a malformed input that makes the loader hang fails the
test instead of stalling CI.

And every test runs with the garbage collector's view of the heap frozen
(``gc.freeze()``) as it stood when the test began: a failed load ends with
``gc.collect()`` (the pipeline drops the half-built model), which with torch,
bitsandbytes and gguf imported scans ~400k objects, 0.1-0.2 s per failure.
Frozen, it scans only what the test created, which is where a half-loaded model would be.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Iterator
from datetime import timedelta
from types import FrameType

import pytest
from hypothesis import HealthCheck, settings

FUZZ_PROFILE = "loader-fuzz"
DEFAULT_FUZZ_EXAMPLES = 200
DEFAULT_TEST_TIMEOUT_S = 60


def fuzz_examples() -> int:
    """``LOADER_FUZZ_EXAMPLES`` or 200."""
    raw = os.environ.get("LOADER_FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else DEFAULT_FUZZ_EXAMPLES


settings.register_profile(
    FUZZ_PROFILE,
    derandomize=os.environ.get("LOADER_FUZZ_RANDOM", "") not in ("1", "true", "yes"),
    database=None,
    max_examples=fuzz_examples(),
    deadline=timedelta(milliseconds=2000),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)


class TestTookTooLong(Exception):
    """Raised in the test's thread when the alarm goes off."""


@pytest.fixture(autouse=True)
def _time_limit() -> Iterator[None]:
    """Fail a test that runs longer than ``LOADER_RELIABILITY_TIMEOUT`` seconds (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return
    limit = int(os.environ.get("LOADER_RELIABILITY_TIMEOUT", DEFAULT_TEST_TIMEOUT_S))

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TestTookTooLong(f"test ran past {limit} s: the loader hangs on this input")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """``gc.freeze()`` for the test's duration, so each failed load's ``gc.collect()`` stays cheap."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
