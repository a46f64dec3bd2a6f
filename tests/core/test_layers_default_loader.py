"""default_weight_loader: shape-checked read for parameters without sharding."""

from __future__ import annotations

import pytest
import torch

from loader.errors import ShapeMismatchError
from loader.layers import default_weight_loader
from loader.weights import EagerTensor


def test_reads_whole_tensor_converting_dtype():
    param = torch.nn.Parameter(torch.empty(2, 3, dtype=torch.bfloat16), requires_grad=False)
    src = torch.arange(6.0).view(2, 3)
    default_weight_loader(param, EagerTensor(src))
    torch.testing.assert_close(param.data, src.to(torch.bfloat16))


def test_shape_mismatch_message():
    param = torch.nn.Parameter(torch.empty(2, 3), requires_grad=False)
    bad = EagerTensor(torch.zeros(3, 2), "a.weight", "x.safetensors")
    with pytest.raises(ShapeMismatchError,
                       match=r"tensor 'a.weight' in x.safetensors: expected shape \(2, 3\), found \(3, 2\)"):
        default_weight_loader(param, bad)


def test_shard_id_is_refused():
    param = torch.nn.Parameter(torch.empty(2), requires_grad=False)
    with pytest.raises(ValueError, match="has no shards"):
        default_weight_loader(param, EagerTensor(torch.zeros(2)), "q")
