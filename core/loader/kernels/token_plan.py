"""Which way a quantized layer multiplies, per activation dtype and tokens in the call: the plan and its rules.

Why: which path is fastest depends on the activations' dtype and on how many tokens one call carries. On this
project's 2-core machines torch's packed int4 kernel in float32 is 10-50x slower than the same kernel on
bfloat16-cast activations; at 512 tokens dequantizing the weight on every call and multiplying in bfloat16 beats
the packed kernel; at one token the packed kernel beats everything. A quantized layer can run one of these
**paths** over the same kept weight:

``packed``
    the packed kernel in the activations' own dtype (bfloat16/float16; float32 only with the exact option,
    whose scales are kept in float32).
``packed-bf16``
    float32 activations cast to bfloat16, the packed kernel, the result cast back to float32.
``dequantize``
    the weight dequantized from the kept codes on every call (in the activations' dtype), then one matmul.
``dense``
    the weight dequantized once at load and kept beside the codes (only within the dense budget,
    ``LOADER_KERNEL_DENSE_BUDGET``).

A :class:`TokenPlan` names one path per :data:`TOKEN_BUCKETS` bucket for one activation dtype. It is chosen by
:func:`plan_from_timings` from timings measured on this machine (:mod:`loader.kernels.kernel_timing`), or by the
documented static rule (:func:`static_plan`) when measuring is off (``LOADER_KERNEL_MEASURE=0``) or a dtype
was not measured. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

__all__ = ["DENSE", "DEQUANTIZE", "MARGIN", "PACKED", "PACKED_BF16", "PATHS", "TOKEN_BUCKETS", "TokenPlan",
           "bucket_label", "plan_from_timings", "static_plan", "token_bucket"]

PACKED = "packed"
PACKED_BF16 = "packed-bf16"
DEQUANTIZE = "dequantize"
DENSE = "dense"
PATHS = (PACKED, PACKED_BF16, DEQUANTIZE, DENSE)
"""Every path name, in the static rule's order of preference."""

TOKEN_BUCKETS = (1, 8, 32, 128, 512)
"""The token counts measured; a call of ``m`` tokens runs the plan of the bucket :func:`token_bucket` gives."""

MARGIN = 1.2
"""How much slower than the fastest measured path the static rule's path may be and still be kept: timings on
a shared machine move by tens of percent, and the rule's path is the one known good on every machine measured."""

_UPPER = (1, 16, 64, 256)  # the last token count of each bucket but the last (geometric midpoints)


def token_bucket(tokens: int) -> int:
    """The bucket (one of :data:`TOKEN_BUCKETS`) of a call with ``tokens`` rows: 1; 2-16; 17-64; 65-256; 257+."""
    for bucket, upper in zip(TOKEN_BUCKETS, _UPPER, strict=False):
        if tokens <= upper:
            return bucket
    return TOKEN_BUCKETS[-1]


def bucket_label(bucket: int) -> str:
    """The tokens a bucket covers, as the report prints them: ``1``, ``2-16``, ..., ``257+``."""
    index = TOKEN_BUCKETS.index(bucket)
    low = 1 if index == 0 else _UPPER[index - 1] + 1
    if index == len(_UPPER):
        return f"{low}+"
    return str(low) if low == _UPPER[index] else f"{low}-{_UPPER[index]}"


@attrs.frozen
class TokenPlan:
    """One path per token bucket for activations of one dtype.

    :ivar dtype: the activations' dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
    :ivar paths: one path name per :data:`TOKEN_BUCKETS` entry.
    :ivar source: ``"measured"`` (timed on this machine), ``"static"`` (the static rule) or ``"requested"``.
    """

    dtype: str
    paths: tuple[str, ...]
    source: str = "static"

    def path_for(self, tokens: int) -> str:
        """The path a call of ``tokens`` rows runs."""
        return self.paths[TOKEN_BUCKETS.index(token_bucket(tokens))]

    def record(self) -> dict[str, str]:
        """``{"1": path, "2-16": path, ...}`` for the load report."""
        return {bucket_label(b): path for b, path in zip(TOKEN_BUCKETS, self.paths, strict=True)}


def static_plan(dtype: str, available: Sequence[str], exact: bool = False) -> TokenPlan:
    """The documented rule used without timings: every bucket runs the same path, the first available of

    - bfloat16/float16 activations: ``packed``, ``dequantize``;
    - float32 activations: ``packed-bf16``, ``dequantize`` (``exact``: ``dense``, ``dequantize`` — the float32
      packed kernel was slower than dequantizing at every size measured here).

    :raises ValueError: nothing in ``available`` fits the rule (a method always offers ``dequantize``).
    """
    if dtype != "float32":
        order: tuple[str, ...] = (PACKED, DEQUANTIZE)
    else:
        order = (DENSE, DEQUANTIZE) if exact else (PACKED_BF16, DEQUANTIZE)
    chosen = next((path for path in order if path in available), None)
    if chosen is None:
        raise ValueError(f"no path of {list(available)} fits the static rule for {dtype} activations ({list(order)})")
    return TokenPlan(dtype, (chosen,) * len(TOKEN_BUCKETS), "static")


def plan_from_timings(dtype: str, timings: Mapping[int, Mapping[str, float]], available: Sequence[str],
                      exact: bool = False) -> TokenPlan:
    """Per bucket, the fastest of ``available`` that has a timing — but the static rule's path when it is
    within :data:`MARGIN` of it, unless the fastest is ``dequantize`` (the dequantized twin); a bucket where
    none has a timing falls back to the static rule's path (a kernel missing on this layer, or never measured,
    is never chosen).

    :param timings: seconds per call, by bucket then path (paths the layer cannot run may appear: skipped).
    """
    static = static_plan(dtype, available, exact)
    paths = []
    for index, bucket in enumerate(TOKEN_BUCKETS):
        measured = {path: t for path, t in timings.get(bucket, {}).items() if path in available}
        fallback = static.paths[index]
        if not measured:
            paths.append(fallback)
            continue
        fastest = min(measured, key=lambda p: measured[p])
        # the static rule's path stands unless another is clearly faster (timing noise must not flip it); the
        # dequantized twin replaces it whenever faster at all: a quantized path is never slower than its twin
        keep = fallback in measured and measured[fallback] <= MARGIN * measured[fastest] and fastest != DEQUANTIZE
        paths.append(fallback if keep else fastest)
    return TokenPlan(dtype, tuple(paths), "measured")
