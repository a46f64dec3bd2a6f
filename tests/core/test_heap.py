"""The allocator settling the kernel-path timings rely on (loader._heap): a fresh process in which per-call
temporaries fault in fresh pages on every call until it frees a large block, and not after."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loader._heap import settle_malloc_thresholds

_CHILD = r"""
import ctypes, json, resource, sys
from loader._heap import settle_malloc_thresholds

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]

def faults_of_temporaries():
    # what a dequantizing call does: a few temporaries of several MiB, written, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        blocks = [libc.malloc(8 << 20) for _ in range(3)]
        for block in blocks:
            ctypes.memset(block, 1, 8 << 20)
        for block in blocks:
            libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

unsettled = faults_of_temporaries()
settled = settle_malloc_thresholds()
faults_of_temporaries()  # the first round after settling fills the heap once
print(json.dumps({"unsettled": unsettled, "settled": settled, "after": faults_of_temporaries()}))
"""


@pytest.mark.skipif(not settle_malloc_thresholds(), reason="glibc's thresholds only")
def test_settled_thresholds_serve_per_call_temporaries_without_fresh_pages():
    out = subprocess.run([sys.executable, "-c", _CHILD], check=True, capture_output=True, text=True).stdout
    faults = json.loads(out)
    assert faults["settled"] is True
    assert faults["unsettled"] > 4 * 3 * 1000  # every 8 MiB temporary mapped afresh: ~2048 faults each
    assert faults["after"] < 200, faults


def test_settling_is_done_once_per_process():
    assert settle_malloc_thresholds() == settle_malloc_thresholds()
    assert settle_malloc_thresholds.cache_info().currsize == 1
