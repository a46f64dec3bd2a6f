"""One small thread pool for work that leaves the GIL: positioned reads, page-table population.

``os.preadv``, ``numpy`` byte copies and C calls through ``ctypes`` release
the GIL, so a few threads keep a page-cache copy or an NVMe queue busier than
one (benchmarks/RESULTS.md, "Read paths"). Formats and the core share this
pool rather than each starting its own. ``LOADER_READ_THREADS`` sets its size
(default: the CPU count, at most 8).
The pool is rebuilt in a forked child, which has none of the parent's threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ._settings import READ_THREADS

__all__ = ["io_pool", "io_threads", "run_in_pool"]

_pool: ThreadPoolExecutor | None = None
_pool_threads = 0
_pool_lock = threading.Lock()
_in_pool = threading.local()


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's threads: start over with a new pool and lock."""
    global _pool, _pool_threads, _pool_lock
    _pool, _pool_threads, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def io_threads() -> int:
    """Threads in the pool: ``LOADER_READ_THREADS`` if set, else the CPU count capped at 8.

    :raises loader.errors.SettingError: ``LOADER_READ_THREADS`` is not a whole number of at least 1.
    """
    return READ_THREADS.read()


def _mark_pool_thread() -> None:
    _in_pool.active = True


def io_pool() -> ThreadPoolExecutor | None:
    """The shared pool, or ``None`` when work should stay on the calling thread.

    ``None`` inside a pool thread (a task that splits its work again would wait
    on tasks queued behind itself) and when only one thread is configured.
    """
    global _pool, _pool_threads
    if getattr(_in_pool, "active", False):
        return None
    threads = io_threads()
    if threads < 2:
        return None
    with _pool_lock:
        if _pool is None or _pool_threads != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="loader-io", initializer=_mark_pool_thread
            )
            _pool_threads = threads
        return _pool


def run_in_pool(tasks: list[Callable[[], None]]) -> None:
    """Run ``tasks`` on the pool (or inline without one), wait for all, and re-raise the first failure."""
    pool = io_pool() if len(tasks) > 1 else None
    if pool is None:
        for task in tasks:
            task()
        return
    futures: list[Future[None]] = [pool.submit(task) for task in tasks]
    error: BaseException | None = None
    for future in futures:
        exc = future.exception()
        if exc is not None and error is None:
            error = exc
    if error is not None:
        raise error
