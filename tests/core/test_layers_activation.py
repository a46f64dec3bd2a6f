"""SiluAndMul splits the fused gate/up output in halves."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loader.layers import SiluAndMul


def test_silu_of_first_half_times_second_half():
    x = torch.randn(2, 3, 10)
    out = SiluAndMul()(x)
    assert out.shape == (2, 3, 5)
    torch.testing.assert_close(out, F.silu(x[..., :5]) * x[..., 5:])
