"""What ``RESULTS.md`` says about where and how it was measured: CPU, memory, versions, environment."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["describe_environment", "describe_machine", "describe_software"]


def _cpuinfo() -> tuple[str, int]:
    models: list[str] = []
    count = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                models.append(value.strip())
            elif key.strip() == "processor":
                count += 1
    except OSError:
        pass
    model = models[0] if models else platform.processor() or "unknown CPU"
    return model, count or (os.cpu_count() or 0)


def _vector_isa() -> str:
    """The widest x86 vector extension the CPU reports: torch's CPU kernels (the int4 matmul and its weight
    layout among them) differ between AVX512 and AVX2, and machines of the same model name differ in it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                flags = set(value.split())
                return next((isa for isa in ("avx512f", "avx2", "avx") if isa in flags), "no AVX").upper()
    except OSError:
        pass
    return platform.machine() or "unknown ISA"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _thp() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def describe_machine() -> str:
    """One line: CPU model and logical CPUs, memory, kernel, transparent huge page mode."""
    model, count = _cpuinfo()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else count
    memory = _mem_total_gib()
    shown_memory = f"{memory:.1f} GiB RAM" if memory is not None else "RAM unknown"
    return (f"{model} ({_vector_isa()}), {count} logical CPUs ({usable} usable), {shown_memory}, "
            f"Linux {platform.release()}, transparent_hugepage `{_thp()}`")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_revision(repo: Path) -> str:
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=repo, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def describe_software(repo: Path) -> str:
    """Python and the versions of every package on the measured paths, plus the repository revision."""
    packages = ("loader-core", "loader-plugin-safetensors", "torch", "transformers", "safetensors")
    versions = ", ".join(f"{name} {_version(name)}" for name in packages)
    return f"Python {platform.python_version()}, {versions}, repository at `{_git_revision(repo)}`"


def describe_environment() -> str:
    """The variables that change thread counts, and the load average (a busy machine skews everything)."""
    variables = ("OMP_NUM_THREADS", "LOADER_READ_THREADS")
    shown = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in variables)
    load = "/".join(f"{value:.2f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return f"{shown}; load average (1/5/15 min) at start {load}"
