"""Recover Llama 3 rotary scaling from the ``rope_freqs`` tensor llama.cpp writes instead of metadata.

llama.cpp's converter turns a Llama 3.1+ ``rope_scaling`` (``rope_type: llama3``) into one
float32 divisor per rotary frequency, stored as the tensor ``rope_freqs.weight``, and writes
no scaling metadata. ``transformers`` drops that tensor and so loads such files *without*
the scaling. We derive the HF ``rope_scaling`` it came from instead, so the model's rotary
embedding applies the same frequencies llama.cpp does:

* divisors equal to 1 are the high frequencies, divisors equal to the maximum are the low
  ones and give ``factor``;
* for the frequencies in between, llama3's smoothing ``s = (L / wavelen - lf) / (hf - lf)``
  is linear in ``1 / wavelen``, so two or more of them determine ``L / (hf - lf)`` and
  ``lf / (hf - lf)`` (we fix ``lf = 1``, which loses nothing: only those ratios matter);
* fewer than two in-between points leave a family of solutions; any member that puts every
  frequency on the right side of the thresholds gives the same rotary embedding.

The result is always checked by recomputing the divisors; a mismatch is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import UnsupportedError

__all__ = ["llama3_divisors", "llama3_scaling_from_divisors"]

_TOLERANCE = 1e-4


def _wavelengths(theta: float, head_dim: int) -> np.ndarray:
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    return 2 * math.pi * theta**exponents


def llama3_divisors(scaling: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """The per-frequency divisors llama3 scaling implies (what llama.cpp stores in ``rope_freqs``)."""
    factor = float(scaling["factor"])
    lf = float(scaling["low_freq_factor"])
    hf = float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    wavelen = _wavelengths(theta, head_dim)
    smooth = (old / wavelen - lf) / (hf - lf)
    medium = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / hf, 1.0, np.where(wavelen > old / lf, factor, medium))


def _fit(wavelen: np.ndarray, divisors: np.ndarray, factor: float) -> tuple[float, float]:
    """``(original_max_position_embeddings, high_freq_factor)`` with ``low_freq_factor = 1``."""
    ones = np.abs(divisors - 1.0) <= _TOLERANCE
    full = np.abs(divisors - factor) <= _TOLERANCE * factor
    medium = ~ones & ~full
    shortest_full = float(wavelen[full].min()) if full.any() else math.inf
    longest_one = float(wavelen[ones].max()) if ones.any() else 0.0
    if medium.sum() >= 2:
        x = 1.0 / wavelen[medium]
        smooth = (1.0 / divisors[medium] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(x, smooth, 1)
        a, b = float(slope), -float(intercept)
        if not (a > 0 and b > 0):
            raise ValueError("in-between divisors do not follow llama3 smoothing")
        old, hf = float(a / b), float(1.0 + 1.0 / b)
        if abs(old - round(old)) < 1e-3 * old:
            old = float(round(old))
        if abs(hf - round(hf, 3)) <= 1e-6 * hf:  # the float32 divisors blur 4.0 into 3.99999997
            hf = round(hf, 3)
        return old, hf
    if medium.sum() == 1:
        w = float(wavelen[medium][0])
        one_smooth = (1.0 / float(divisors[medium][0]) - 1.0 / factor) / (1.0 - 1.0 / factor)
        old = float(math.ceil(w))
        return old, 1.0 + (old / w - 1.0) / one_smooth
    # no frequency in between: put both thresholds in the gap between the two groups
    low = max(longest_one, 1.0)
    old = float(math.floor(math.sqrt(low * shortest_full))) if math.isfinite(shortest_full) else 2 * low
    return old, old / math.sqrt(low * old) if low < old else 2.0


def llama3_scaling_from_divisors(divisors: Sequence[float], theta: float, head_dim: int,
                                 where: str) -> dict[str, Any] | None:
    """The ``rope_scaling`` dict (``rope_type: llama3``) whose divisors equal ``divisors``.

    ``None`` when every divisor is 1 (no scaling). ``where`` names the tensor in errors.
    """
    values = np.asarray(divisors, dtype=np.float64)
    if values.shape != (head_dim // 2,):
        raise UnsupportedError(f"{where}: holds {values.size} rotary divisors; a head size of {head_dim} "
                               f"needs {head_dim // 2}")
    if not np.all(np.isfinite(values)) or values.min() < 1.0 - _TOLERANCE:
        raise UnsupportedError(f"{where}: rotary divisors must be finite and at least 1")
    factor = float(values.max())
    if factor <= 1.0 + _TOLERANCE:
        return None
    wavelen = _wavelengths(theta, head_dim)
    try:
        old, hf = _fit(wavelen, values, factor)
    except ValueError as exc:
        raise UnsupportedError(f"{where}: rotary divisors are not Llama 3 scaling ({exc})") from exc
    scaling: dict[str, Any] = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": hf,
        "original_max_position_embeddings": int(old),
    }
    if old != int(old) or not np.allclose(llama3_divisors(scaling, theta, head_dim), values,
                                          rtol=_TOLERANCE, atol=0):
        raise UnsupportedError(f"{where}: rotary divisors are not Llama 3 scaling (factor {factor}); "
                               "no low/high frequency thresholds reproduce them")
    return scaling
