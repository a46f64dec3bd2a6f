"""loader.update_weights on a GGUF model whose blocks stay packed: a float tensor for a packed layer is refused."""

from __future__ import annotations

import pytest
import torch

import loader
from loader.errors import UnsupportedError
from tests.helpers.gguf_files import Q


def test_a_float_tensor_for_a_packed_layer_is_refused_by_name(tiny_gguf) -> None:
    path, hf_model = tiny_gguf("llama", Q.Q8_0)
    model = loader.load_model(str(path))  # dtype "auto": Q8_0 blocks kept packed
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    state = hf_model.state_dict()
    with pytest.raises(UnsupportedError, match=r"tensor 'model.layers.0.self_attn.k_proj.weight' of the update is "
                                               r"for layer 'model.layers.0.self_attn.qkv_proj', which cannot be "
                                               r"updated in place: its quantize method GGUFLinearMethod does not "
                                               r"take new weights in place; nothing was written"):
        loader.update_weights(model, {name: state[name] for name in ("model.norm.weight",
                                                                      "model.layers.0.self_attn.k_proj.weight")})
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert loader.weights_version(model) == 0
