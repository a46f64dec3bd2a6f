"""The benchmark's own virtualenv with llama.cpp's Python binding, built from the sdist for this CPU.

llama.cpp is the reference the GGUF benchmarks compare against (issue 17), but it is not a dependency of loader
or of its tests, so it lives in a separate environment under ``benchmarks/out/`` (git-ignored) that the
benchmark creates on first use. pip compiles ``llama-cpp-python`` from its source distribution (gcc, cmake and
ninja must be installed; a few minutes on 2 cores) with the CPU backend only; the version is pinned so two runs
of the benchmark compare the same llama.cpp.

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
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_NATIVE=ON",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1), "FORCE_CMAKE": "1"}
    # The benchmark's pins (torch etc.) are about loader's environment, not this one.
    env.pop("PIP_CONSTRAINT", None)
    subprocess.run([str(python), "-m", "pip", "install", "--no-binary", "llama-cpp-python", LLAMA_CPP_PYTHON],
                   env=env, check=True)
    if not _has_binding(python):
        raise RuntimeError(f"{LLAMA_CPP_PYTHON} installed into {venv_dir} but does not import")
    return python


def _has_binding(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True, check=False)
    return done.returncode == 0


if __name__ == "__main__":
    print(llamacpp_python())
    sys.exit(0)
