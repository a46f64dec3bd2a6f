"""Public: the I/O helpers a format plugin reads files with.

- the shared I/O thread pool (``LOADER_READ_THREADS``): :func:`io_pool`,
  :func:`io_threads`, :func:`run_in_pool`;
- positioned exact reads: :func:`pread_exactly` (an open descriptor), :func:`read_file_range` (a path; large
  reads split over the pool);
- the error a file shorter than its header promised raises: :func:`truncated_error`;
- one-pass reads in compiled C, no memory map (``LOADER_FUSED_READS``): a bfloat16/float16 run widened into
  float32 memory (:func:`read_widening`), a row-parallel shard's row slices gathered into place
  (:func:`gather_rows`), when :func:`fused_reads_available`;
- where an array of length-prefixed records ends (GGUF string arrays), in compiled C
  when a compiler is at hand: :func:`u64_prefixed_end`;
- whether fresh memory a read fills should be advised for transparent huge pages on this
  machine (``LOADER_HUGE_PAGES``, else a rule: not in a VM whose balloon reports free pages):
  :func:`advise_fresh_huge_pages`;
- the folder every on-disk cache of loader lives under (``$LOADER_CACHE_DIR``, else the
  user cache folder), for a plugin's own cache in a subfolder: :func:`cache_root`.
"""

from __future__ import annotations

from ._cache_root import cache_root
from ._file_reads import pread_exactly, read_file_range, truncated_error
from ._fused_reads import WIDENED_SOURCES, fused_reads_available, gather_rows, read_widening
from ._huge_pages import advise_fresh_huge_pages
from ._io_pool import io_pool, io_threads, run_in_pool
from ._length_prefixed import u64_prefixed_end

__all__ = [
    "WIDENED_SOURCES",
    "advise_fresh_huge_pages",
    "cache_root",
    "fused_reads_available",
    "gather_rows",
    "io_pool",
    "io_threads",
    "pread_exactly",
    "read_file_range",
    "read_widening",
    "run_in_pool",
    "truncated_error",
    "u64_prefixed_end",
]
