"""The small-tensor arena does not fault in a 2 MiB huge page for a few KiB of norms and rotary tables.

Large tensors get regions of their own, advised for huge pages; the arena that
holds the rest (norm weights, rotary tables: ~70 KiB for a 1 GB Llama) used to
be advised too, so the first write into it (the rotary table, computed before
any weight is read) could fault in a whole 2 MiB page: 2 MiB more peak RSS than
``transformers.from_pretrained`` on the fallback benchmark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from loader._pipeline.materialize import _cpu_arena, materialize

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(),
                               reason="no transparent huge pages here")


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


class _Shaped(nn.Module):
    """Eight 4 MiB matrices (regions of their own) and 17 norms plus a rotary table (the arena)."""

    def __init__(self) -> None:
        super().__init__()
        self.large = nn.ParameterList([nn.Parameter(torch.empty(1024, 1024)) for _ in range(8)])
        self.norms = nn.ParameterList([nn.Parameter(torch.empty(1024)) for _ in range(17)])
        self.register_buffer("inv_freq", torch.empty(64), persistent=False)


@needs_thp
def test_writing_a_rotary_table_into_the_arena_costs_pages_not_a_huge_page():
    with torch.device("meta"):
        model = _Shaped()
    materialize(model, torch.device("cpu"))
    before = _rss_anon_kib()
    model.inv_freq.fill_(1.0)
    assert _rss_anon_kib() - before < 1024


@needs_thp
def test_an_arena_of_several_huge_pages_is_still_advised_for_them():
    arena = _cpu_arena(6 << 20)
    before = _rss_anon_kib()
    arena[:1].fill_(1)  # one byte faults in a whole huge page where the advice holds
    assert _rss_anon_kib() - before >= 2048
