"""``loader.kernels.packed_layout_fingerprint``: a digest of what decides packed bytes, to key packed weights kept on
disk."""

from __future__ import annotations

from pathlib import Path

import torch

from loader.kernels import fingerprint as module
from loader.kernels import packed_layout_fingerprint


def test_the_packed_layout_fingerprint_changes_with_torch_the_layout_or_the_code(monkeypatch, tmp_path):
    fingerprint = packed_layout_fingerprint()
    assert len(fingerprint) == 64 and fingerprint == module.packed_layout_fingerprint.__wrapped__()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert module.packed_layout_fingerprint.__wrapped__() != fingerprint
    monkeypatch.undo()
    other = 32 if module.torch_int4_block_n() != 32 else 64
    monkeypatch.setattr(module, "torch_int4_block_n", lambda: other)
    assert module.packed_layout_fingerprint.__wrapped__() != fingerprint
    monkeypatch.undo()
    # an edited packer: the same module files read from a copy with one byte changed
    for name in module.PACKING_SOURCES:
        (tmp_path / name).write_bytes((Path(module.__file__).parent / name).read_bytes())
    (tmp_path / "native_packing.c").write_bytes((tmp_path / "native_packing.c").read_bytes() + b"\n")
    monkeypatch.setattr(module, "__file__", str(tmp_path / "fingerprint.py"))
    assert module.packed_layout_fingerprint.__wrapped__() != fingerprint


def test_every_packing_source_is_hashed():
    """The sources named are the package's packers (a new packer module must be added to the digest)."""
    here = Path(module.__file__).parent
    assert all((here / name).is_file() for name in module.PACKING_SOURCES)
    packers = {p.name for p in here.iterdir() if p.suffix in (".py", ".c")} - {
        "__init__.py", "fingerprint.py", "choice.py", "bundle.py", "bundle_file.py", "load_bundle.py",
        # what runs at forward time and how it is chosen (its timings have their own fingerprint)
        "token_plan.py", "kernel_timing.py", "weight_paths.py"}
    assert packers == set(module.PACKING_SOURCES)
