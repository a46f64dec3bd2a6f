"""The benchmark's own virtualenv with llama.cpp's Python binding, built from the sdist for this CPU.

llama.cpp is the reference the GGUF benchmarks compare against (issue 17), but it is not a dependency of loader
or of its tests, so it lives in a separate environment under ``benchmarks/out/`` (git-ignored) that the
benchmark creates on first use. pip compiles ``llama-cpp-python`` from its source distribution (gcc, cmake and
ninja must be installed; 15-30 minutes on 2 cores) with the CPU backend only, for this CPU's instruction sets
except AMX (:func:`cmake_args`); the version is pinned so two runs of the benchmark compare the same llama.cpp.

Usage: ``python benchmarks/llamacpp_venv.py`` (prints the interpreter's path; does nothing if it exists).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
VENV = Path(__file__).resolve().parent / "out" / "llamacpp-venv"


def llamacpp_python(venv_dir: Path = VENV) -> Path:
    """The venv's interpreter, creating the venv and building the pinned binding first if it is missing."""
    python = venv_dir / "bin" / "python"
    if python.exists() and _has_binding(python):
        return python
    venv.create(venv_dir, with_pip=True, clear=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_args()),
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1), "FORCE_CMAKE": "1"}
    # The benchmark's pins (torch etc.) are about loader's environment, not this one.
    env.pop("PIP_CONSTRAINT", None)
    # --no-cache-dir: pip's wheel cache is keyed by the sdist, not CMAKE_ARGS, and would hand back an old build
    subprocess.run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-binary", "llama-cpp-python",
                    LLAMA_CPP_PYTHON], env=env, check=True)
    if not _has_binding(python):
        raise RuntimeError(f"{LLAMA_CPP_PYTHON} installed into {venv_dir} but does not import")
    return python


# /proc/cpuinfo flag -> the ggml option that compiles for it
_X86_OPTIONS = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "avx_vnni": "GGML_AVX_VNNI", "bmi2": "GGML_BMI2",
                "fma": "GGML_FMA", "f16c": "GGML_F16C", "avx512f": "GGML_AVX512",
                "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
                "avx512_bf16": "GGML_AVX512_BF16"}


def cmake_args(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """CPU backend only, for this CPU's instruction sets — but never Intel AMX.

    Why not ``GGML_NATIVE=ON``: on a Xeon with AMX (``amx_tile``/``amx_int8`` in ``/proc/cpuinfo``,
    2026-12-01) a native build of 0.3.36 crashes with SIGSEGV in its first ``decode`` of SmolLM2 Q4_1
    (1 or 2 threads, with or without another model loaded first). Every other extension the CPU reports
    is switched on by name, so the build is what native gives minus AMX; elsewhere (no x86 flags) native.
    """
    base = ["-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF"]
    try:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx" not in flags:
        return [*base, "-DGGML_NATIVE=ON"]
    options = [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in _X86_OPTIONS.items()]
    return [*base, "-DGGML_NATIVE=OFF", *options, "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_BF16=OFF"]


def _has_binding(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True, check=False)
    return done.returncode == 0


if __name__ == "__main__":
    print(llamacpp_python())
    sys.exit(0)
