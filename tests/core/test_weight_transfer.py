"""The trainer-to-inference weight transfer in one process: specs, buckets, the header check, bad input.

The three-process transfer itself (a trainer and a TP=2 group) is tests/e2e/test_update_from_distributed.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import loader
from loader._updates.transfer import ALIGNMENT, Header, check_specs, disagreement, pack, plan_buckets, unpack
from loader.errors import ConfigError, UnsupportedError
from loader.layers import RowParallelLinear


def _spec(name: str, *shape: int, dtype: torch.dtype = torch.float32) -> loader.WeightSpec:
    return loader.WeightSpec(name, shape, dtype)


@pytest.fixture
def world_of_one(tmp_path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_weight_specs_follow_the_state_dict() -> None:
    specs = loader.weight_specs({"a": torch.zeros(2, 3), "b": torch.zeros((), dtype=torch.bfloat16)})
    assert specs == (_spec("a", 2, 3), _spec("b", dtype=torch.bfloat16))
    assert [s.nbytes for s in specs] == [24, 2]
    assert str(specs[0]) == "'a' (float32 (2, 3))"


@pytest.mark.parametrize(("state", "message"), [
    ({"a": "values"}, "the value given for 'a' is a str, not a torch.Tensor"),
    ([("a", torch.zeros(1)), ("a", torch.zeros(1))], "'a' is given twice"),
    ([(3, torch.zeros(1))], "weight names are strings; found 3"),
])
def test_weight_specs_refuse_what_cannot_be_sent(state, message) -> None:
    with pytest.raises(UnsupportedError, match=f"^{message}$"):
        loader.weight_specs(state)


@pytest.mark.parametrize(("specs", "message"), [
    ({"a": 1}, "specs is a sequence of loader.WeightSpec .* found a dict"),
    ([("a", (1,), torch.float32)], "specs holds a tuple, not a loader.WeightSpec"),
    ([_spec("a", 1), _spec("a", 2)], "specs list 'a' twice"),
])
def test_specs_that_are_not_specs(specs, message) -> None:
    with pytest.raises(UnsupportedError, match=message):
        check_specs(specs)


def test_buckets_hold_at_most_bucket_bytes_and_a_larger_tensor_travels_alone() -> None:
    specs = [_spec("a", 10), _spec("b", 3), _spec("big", 100), _spec("c", 2), _spec("d", 15)]  # 40 ... 60 B
    buckets = plan_buckets(specs, 128)
    assert [[(s.name, offset) for s, offset in b.entries] for b in buckets] == [
        [("a", 0), ("b", ALIGNMENT)], [("big", 0)], [("c", 0), ("d", ALIGNMENT)]]
    assert [b.size for b in buckets] == [ALIGNMENT + 12, 400, ALIGNMENT + 60]
    assert all(b.size <= 128 for b in buckets if len(b.entries) > 1)
    assert plan_buckets([], 128) == []


def test_a_bucket_packs_and_unpacks_every_dtype_bit_for_bit() -> None:
    tensors = {"f": torch.randn(3, 5), "h": torch.randn(7, dtype=torch.bfloat16), "i": torch.arange(6).view(2, 3),
               "m": torch.tensor([True, False, True]), "t": torch.randn(4, 6).t()}  # "t": not contiguous
    (bucket,) = plan_buckets(list(loader.weight_specs(tensors)), 1 << 20)
    out = dict(unpack(bucket, pack(bucket, tensors, torch.device("cpu"))))
    assert out.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_the_header_check_ignores_order_and_names_each_difference() -> None:
    expected = [_spec("a", 2), _spec("b", 3)]
    assert disagreement(expected, Header(64, (_spec("b", 3), _spec("a", 2))), 64, 0) is None
    error = disagreement(expected, Header(64, (_spec("a", 2, dtype=torch.float16),)), 64, 0)
    assert str(error) == ("the specs disagree with what rank 0 sends: 'a' arrives as float16 (2,) where the specs say "
                          "float32 (2,); 'b' (float32 (3,)) is in the specs but does not arrive")
    many = disagreement([], Header(64, tuple(_spec(f"w{i}", 1) for i in range(7))), 64, 3)
    assert str(many).endswith("'w4' (float32 (1,)) arrives but is not in the specs; ... (7 differences in all)")


def test_a_header_that_is_not_one() -> None:
    with pytest.raises(ConfigError, match=r"^rank 2 sent no weights header \(is it running loader.send_weights\?\)"):
        Header.from_wire("hello", 2)
    wire = Header(8, (_spec("a", 2, dtype=torch.bfloat16),)).to_wire()
    assert Header.from_wire(wire, 0) == Header(8, (_spec("a", 2, dtype=torch.bfloat16),))


def test_without_torch_distributed() -> None:
    with pytest.raises(ConfigError, match=r"^send_weights needs torch.distributed initialized"):
        loader.send_weights({})
    with pytest.raises(ConfigError, match=r"^update_weights_from_distributed needs torch.distributed initialized"):
        loader.update_weights_from_distributed(torch.nn.Linear(2, 2), [], src=0)
    with pytest.raises(ConfigError, match=r"^set_tensor_parallel_group needs torch.distributed initialized first"):
        loader.set_tensor_parallel_group(object())  # type: ignore[arg-type]


@pytest.mark.usefixtures("world_of_one")
def test_src_must_be_another_process_of_the_group() -> None:
    with pytest.raises(UnsupportedError, match=r"^src=0 is this process: the sender calls loader.send_weights"):
        loader.update_weights_from_distributed(torch.nn.Linear(2, 2), [], src=0)
    with pytest.raises(UnsupportedError, match=r"^src must be the sender's rank, one of the group's ranks \[0\]; "
                                               r"found 4$"):
        loader.update_weights_from_distributed(torch.nn.Linear(2, 2), [], src=4)
    with pytest.raises(UnsupportedError, match=r"^update_weights_from_distributed: group is a torch.distributed "
                                               r"process group or None, found a str$"):
        loader.update_weights_from_distributed(torch.nn.Linear(2, 2), [], src=1, group="world")  # type: ignore[arg-type]


@pytest.mark.usefixtures("world_of_one")
def test_a_sender_alone_sends_its_buckets_or_its_error() -> None:
    state = {"a": torch.ones(10), "b": torch.ones(100)}
    assert loader.send_weights(state, bucket_bytes=64) == 40 + 400  # two buckets, no padding
    with pytest.raises(UnsupportedError, match=r"^bucket_bytes must be a whole number of bytes, at least 1; "
                                               r"found 0$"):
        loader.send_weights(state, bucket_bytes=0)
    with pytest.raises(UnsupportedError, match=r"^the value given for 'a' is a int, not a torch.Tensor$"):
        loader.send_weights({"a": 3})


@pytest.mark.usefixtures("world_of_one")
def test_the_tensor_parallel_group_is_the_one_set() -> None:
    with pytest.raises(UnsupportedError, match=r"^set_tensor_parallel_group takes a torch.distributed process "
                                               r"group \(from torch.distributed.new_group\) or None, found a str$"):
        loader.set_tensor_parallel_group("tp")  # type: ignore[arg-type]
    group = dist.new_group([0])
    try:
        loader.set_tensor_parallel_group(group)
        layer = RowParallelLinear(4, 2, bias=False)  # sized and reduced over the group set: of one process
        assert layer(torch.ones(1, 4)).shape == (1, 2)
    finally:
        loader.set_tensor_parallel_group(None)
