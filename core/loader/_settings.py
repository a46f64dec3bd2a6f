"""Every environment variable the core reads, declared once (:mod:`loader.settings` says how a record reads).

:data:`SETTINGS` are the user's: the user guide's table of environment
variables is generated from them and the plugins' (``scripts/gen_docs.py``).
:data:`INTERNAL` are the ones loader sets for itself (for the processes it
starts); they are parsed the same way but are no user setting, and the docs
leave them out. Nothing here is imported by anything heavy: reading a
setting costs a dictionary lookup and a parse.

Names that look like variables but are not are listed in :data:`NOT_VARIABLES`
(the docs check, ``scripts/gen_docs.py --check``, fails on any other
``LOADER_*`` name the code mentions without declaring it).
"""

from __future__ import annotations

import os
from pathlib import Path

from .settings import FLAG, FOLDER, Setting, integer, names, seconds

__all__ = [
    "CACHE_DIR",
    "DISABLE_PLUGINS",
    "FUSED_READS",
    "HUGE_PAGES",
    "INTERNAL",
    "KERNEL_DENSE_BUDGET",
    "KERNEL_EXACT_FLOAT32",
    "KERNEL_MEASURE",
    "MAP_MIN_BYTES",
    "MAP_WEIGHTS",
    "NATIVE_REPACK",
    "NOT_VARIABLES",
    "OVERRIDE_ARCHITECTURES",
    "PLUGINS",
    "PROBE_IN_PROCESS",
    "PROBE_TIMEOUT",
    "READ_THREADS",
    "SETTINGS",
    "SKIP_MEMORY_CHECK",
    "TP_LAUNCHED",
]

# --- plugins and the registry -------------------------------------------------------------------------------

PLUGINS: Setting[frozenset[str] | None] = Setting(
    "LOADER_PLUGINS", names("plugin"), default=None, blank_is_default=False,
    default_doc="unset: every installed plugin",
    doc="comma-separated allow-list of plugin names to load (others are `blocked`); a name no installed plugin "
        "has is an error, an empty value loads none")
DISABLE_PLUGINS = Setting(
    "LOADER_DISABLE_PLUGINS", names("plugin"), default=frozenset[str](),
    doc="comma-separated plugin names not to load")
OVERRIDE_ARCHITECTURES = Setting(
    "LOADER_OVERRIDE_ARCHITECTURES", names("architecture", star=True), default=frozenset[str](),
    doc="comma-separated architecture names (or `*`) that the later of two plugins registering them may take "
        "over, with a warning; otherwise such an architecture refuses to load")
PROBE_IN_PROCESS = Setting(
    "LOADER_PROBE_IN_PROCESS", FLAG, default=False,
    doc="`1`: probe model capabilities in this process instead of a child (for debugging, or where a child "
        "is costly)")
PROBE_TIMEOUT = Setting(
    "LOADER_PROBE_TIMEOUT", seconds(), default=120.0,
    doc="seconds before a capability probe child is abandoned")

# --- caches ----------------------------------------------------------------------------------------------

CACHE_DIR: Setting[Path | None] = Setting(
    "LOADER_CACHE_DIR", FOLDER, default=None, default_doc="the user cache folder's `loader/`",
    doc="where the capability cache (`model-info/`), the compiled packing helpers (`native/`), the kernel "
        "timings (`kernel-timings/`) and GGUF's packed-weights bundles (`gguf-packed/`) live")
NATIVE_REPACK = Setting(
    "LOADER_NATIVE_REPACK", FLAG, default=True,
    doc="`0`: pack int4/int8 weights with torch only; by default the first packed load compiles "
        "`native_packing.c` with `$CC` (else `cc`, ~0.2 s, once per machine) and later loads reuse it; "
        "without a compiler torch packs the same bytes, slower, with one warning")

# --- kernels -----------------------------------------------------------------------------------------------

KERNEL_MEASURE = Setting(
    "LOADER_KERNEL_MEASURE", FLAG, default=True,
    doc="`0`: quantized layers choose their path per token count by the static rule instead of timing each "
        "path on first use (timings are cached in `kernel-timings/`; see [Concepts](concepts.md#kernel-paths))")
KERNEL_EXACT_FLOAT32 = Setting(
    "LOADER_KERNEL_EXACT_FLOAT32", FLAG, default=False,
    doc="`1`: float32 loads of GPTQ/AWQ/compressed-tensors packed layers compute in float32 only, as "
        "`quantization_options={\"exact_float32\": true}` asks (which wins when given); by default float32 "
        "activations may be cast to bfloat16 for the packed kernel")
KERNEL_DENSE_BUDGET = Setting(
    "LOADER_KERNEL_DENSE_BUDGET", integer(0, unit="bytes"), default=0,
    doc="bytes of dequantized weights a load may keep beside the quantized ones, for layers whose measured "
        "fastest path is the kept dense weight (`0`: none; a quantized model stays its quantized size)")

# --- reading and memory ------------------------------------------------------------------------------------


def _default_read_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


READ_THREADS = Setting(
    "LOADER_READ_THREADS", integer(1, unit="threads"), default=_default_read_threads(),
    default_doc="the CPU count, at most 8",
    doc="threads the safetensors reader splits large reads over, that populate mapped pages, and that "
        "post-process layers whose method allows it (GGUF packing) on a CPU load; `1` keeps post-processing "
        "on the loading thread")
MAP_WEIGHTS = Setting(
    "LOADER_MAP_WEIGHTS", FLAG, default=True,
    doc="`0` copies every byte of a CPU load into anonymous memory instead of mapping the checkpoint's pages "
        "into parameters (by default they are mapped where the stored bytes are the parameter's; a file "
        "rewritten in place or truncated while a mapped model lives changes or breaks it, and saving the model "
        "over the very files it was loaded from is such a rewrite: save elsewhere, or load with `0`)")
MAP_MIN_BYTES = Setting(
    "LOADER_MAP_MIN_BYTES", integer(0, unit="bytes"), default=1 << 20,
    doc="CPU tensors at least this large get memory of their own and may be mapped; smaller ones are copied "
        "into a shared arena. Parts landing inside such a tensor (a fused projection's, an expert's) map from "
        "64 KiB, or from this size if lower")
FUSED_READS = Setting(
    "LOADER_FUSED_READS", FLAG, default=True,
    doc="`0`: reads that convert a bfloat16/float16 file into float32, or gather a row-parallel shard's row "
        "slices, go through a bounce buffer and a second copy; by default they are one pass in compiled code "
        "(`fused_reads.c`, built with `$CC` on first use; without a compiler the bounce buffer is used)")
HUGE_PAGES: Setting[bool | None] = Setting(
    "LOADER_HUGE_PAGES", FLAG, default=None, blank_is_default=True,
    default_doc="unset: yes, except in a VM whose virtio balloon reports free pages to its host",
    doc="whether fresh CPU memory a load copies into (parameters not mapped from the file, conversions, "
        "arenas) is advised for transparent huge pages; in a guest with free page reporting huge-page faults "
        "re-fault the host and were 2-5x slower than 4 KiB ones (see [Fresh memory](#fresh-memory-and-huge-pages))")
SKIP_MEMORY_CHECK = Setting(
    "LOADER_SKIP_MEMORY_CHECK", FLAG, default=False,
    doc="`1`: do not refuse models whose parameters exceed the device's free memory (overcommitted hosts, "
        "unified memory)")

SETTINGS: tuple[Setting[object], ...] = (
    PLUGINS, DISABLE_PLUGINS, OVERRIDE_ARCHITECTURES, CACHE_DIR, NATIVE_REPACK, KERNEL_MEASURE, KERNEL_EXACT_FLOAT32,
    KERNEL_DENSE_BUDGET,
    PROBE_IN_PROCESS, PROBE_TIMEOUT, SKIP_MEMORY_CHECK, READ_THREADS, MAP_WEIGHTS, MAP_MIN_BYTES, FUSED_READS,
    HUGE_PAGES,
)
"""The core's user settings, in the order the user guide lists them."""

# --- internal: set by loader for the processes it starts ---------------------------------------------------

TP_LAUNCHED = Setting(
    "LOADER_TP_LAUNCHED", FLAG, default=False,
    doc="set to `1` by `loader load --tensor-parallel-size N` in the torchrun workers it starts, so they "
        "load instead of launching again")

INTERNAL: tuple[Setting[object], ...] = (TP_LAUNCHED,)
"""Variables loader sets for itself; parsed like the others, never documented as a user setting."""

NOT_VARIABLES: dict[str, str] = {
    "LOADER_REPACK_SCALAR": "a C macro the tests define (-D) when compiling native_packing.c, not a variable",
}
"""``LOADER_*`` names in the code that are no environment variable, and what each is."""
