"""The load's progress bar: bytes of checkpoint tensors handed to the model, with the total and the rate.

Counted in bytes rather than tensors because tensors differ in size by orders
of magnitude (an embedding against a norm), so a tensor count says little
about time left. Shown on stderr, only when asked (a terminal, no ``--json``),
and only once a load has run for a second: a fast load prints nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

from ..weights import CheckpointTensor

__all__ = ["PROGRESS_DELAY_S", "checkpoint_size", "with_progress"]

PROGRESS_DELAY_S = 1.0
_BAR = "{l_bar}{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]"


def checkpoint_size(files: Sequence[str]) -> int | None:
    """Total size of the weight files, or ``None`` when one is not a local file (a remote source)."""
    total = 0
    for name in files:
        try:
            total += os.path.getsize(name)
        except OSError:
            return None
    return total


def with_progress(stream: Iterator[tuple[str, CheckpointTensor]], enabled: bool,
                  total: int | None) -> Iterator[tuple[str, CheckpointTensor]]:
    """``stream`` unchanged, advancing a byte progress bar by each tensor's size as the model takes it."""
    if not enabled:
        yield from stream
        return
    from tqdm import tqdm

    with tqdm(desc="loading", total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
              file=sys.stderr, delay=PROGRESS_DELAY_S, bar_format=_BAR) as bar:
        for name, tensor in stream:
            yield name, tensor
            bar.update(tensor.nbytes)
