"""Which experts of a mixture-of-experts layer live on this rank, and which slice of each.

Two placements, as in vLLM. Under tensor parallelism alone every rank holds
every expert and a ``1/tp`` slice of each expert's intermediate dimension
(gate/up rows, down columns), so a rank reads a slice of every expert's
bytes. With expert parallelism (``enable_expert_parallel``; expert parallel
size = tensor parallel size) a rank holds whole experts, a contiguous run of
global ids, and reads only those experts' bytes; attention stays split by
heads. ``E`` experts over ``n`` ranks: the first ``E % n`` ranks hold
``E // n + 1`` experts, the others ``E // n`` (vLLM's split), so 10 experts
over 4 ranks are 3, 3, 2, 2.
"""

from __future__ import annotations

import attrs

from ..errors import UnsupportedError

__all__ = ["ExpertPlacement", "place_experts"]


@attrs.frozen
class ExpertPlacement:
    """This rank's share of one MoE layer.

    :ivar num_experts: experts in the checkpoint (global).
    :ivar first_expert: the global id of this rank's first expert.
    :ivar num_local_experts: how many consecutive experts this rank holds.
    :ivar slice_rank: this rank's index along the experts' intermediate split
        (0 under expert parallelism: experts are whole).
    :ivar slice_count: how many ranks split each expert's intermediate
        dimension (1 under expert parallelism).
    :ivar expert_parallel: whether whole experts are spread over ranks.
    """

    num_experts: int
    first_expert: int
    num_local_experts: int
    slice_rank: int
    slice_count: int
    expert_parallel: bool

    @property
    def local_experts(self) -> range:
        """The global ids this rank holds, in the order its parameters stack them."""
        return range(self.first_expert, self.first_expert + self.num_local_experts)

    def local_index(self, expert_id: int) -> int | None:
        """Where global expert ``expert_id`` sits in this rank's parameters; ``None`` when another rank holds it."""
        index = expert_id - self.first_expert
        return index if 0 <= index < self.num_local_experts else None

    @property
    def is_complete(self) -> bool:
        """Whether this rank holds every expert (no token's choice lands elsewhere)."""
        return self.num_local_experts == self.num_experts


def place_experts(num_experts: int, tp_rank: int, tp_size: int, *, expert_parallel: bool,
                  what: str = "experts") -> ExpertPlacement:
    """This rank's share of ``num_experts`` experts among ``tp_size`` ranks.

    :raises UnsupportedError: expert parallelism over more ranks than experts
        (a rank would hold none), naming ``what``.
    """
    if num_experts < 1:
        raise UnsupportedError(f"{what}: a mixture-of-experts layer needs at least one expert, got {num_experts}")
    if not expert_parallel or tp_size == 1:
        return ExpertPlacement(num_experts, 0, num_experts, tp_rank, tp_size, False)
    if tp_size > num_experts:
        raise UnsupportedError(
            f"{what}: enable_expert_parallel places whole experts on ranks, but tensor parallel size {tp_size} "
            f"is larger than num_experts={num_experts} (a rank would hold no expert); use at most "
            f"{num_experts} ranks or leave expert parallelism off"
        )
    base, extra = divmod(num_experts, tp_size)
    count = base + (1 if tp_rank < extra else 0)
    first = tp_rank * base + min(tp_rank, extra)
    return ExpertPlacement(num_experts, first, count, 0, 1, True)
