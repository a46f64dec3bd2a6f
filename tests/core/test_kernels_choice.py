"""``loader.kernels.choose_kernel``: one chooser and one record for which kernel a layer runs, why, and from what."""

from __future__ import annotations

import pytest

from loader.kernels import KernelChoice, KernelOption, choose_kernel


def test_the_first_option_that_takes_the_layer_is_chosen():
    options = [KernelOption("marlin", "no CUDA device"), KernelOption("int4pack"), KernelOption("int8pack")]
    assert choose_kernel(options, "dequantize") == KernelChoice("int4pack")


def test_when_none_takes_the_layer_the_fallback_gives_the_preferred_option_s_reason():
    options = [KernelOption("int4", "output features 40 are not a multiple of 16"), KernelOption("int4x2", "other")]
    assert choose_kernel(options, "dequantized") == KernelChoice("dequantized",
                                                                  "output features 40 are not a multiple of 16")
    assert choose_kernel([], "dense") == KernelChoice("dense")


def test_what_the_layer_is_stored_as_is_recorded_and_a_fallback_s_dtype():
    chosen = choose_kernel([KernelOption("int4")], "dequantized", types=["Q4_1", "Q4_1"], dtype="bfloat16")
    assert chosen == KernelChoice("int4", None, ("Q4_1", "Q4_1"))
    refused = choose_kernel([KernelOption("int4", "no")], "dequantized", types=("Q6_K",), dtype="bfloat16")
    assert refused == KernelChoice("dequantized", "no", ("Q6_K",), 0, "bfloat16")


@pytest.mark.parametrize(("choice", "record"), [
    (KernelChoice("int4pack"), {"kernel": "int4pack", "reason": None}),
    (KernelChoice("dense"), {"kernel": "dense", "reason": None}),
    (KernelChoice("int4", None, ("Q4_K",), 1024),
     {"kernel": "int4", "types": ("Q4_K",), "packed_bytes": 1024, "reason": None, "dtype": None}),
    (KernelChoice("dequantized", "why", ("Q6_K",), 0, "bfloat16"),
     {"kernel": "dequantized", "types": ("Q6_K",), "packed_bytes": 0, "reason": "why", "dtype": "bfloat16"}),
])
def test_the_record_is_the_load_report_s(choice, record):
    """A method that names what a layer is stored as reports it with the bytes kept and a dequantized dtype."""
    assert choice.record() == record
