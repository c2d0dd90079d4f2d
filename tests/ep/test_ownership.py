"""Expert ownership: contiguous blocks covering every expert once, the extra experts on the lowest
ranks, and refusals that say what to change."""
from __future__ import annotations

import pytest

from pegainfer.ep.ownership import Ownership, OwnershipError


@pytest.mark.parametrize("n_experts, world", [(8, 1), (8, 2), (8, 3), (8, 8), (64, 4), (64, 5), (64, 7)])
def test_blocks_cover_every_expert_once_in_rank_order(n_experts: int, world: int) -> None:
    own = Ownership(n_experts, world)
    ranges = [own.experts_of(r) for r in range(world)]
    assert [e for r in ranges for e in r] == list(range(n_experts))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra experts go to the lowest ranks
    assert own.owner_table() == [r for r, rng in enumerate(ranges) for _ in rng]


def test_uneven_split_is_the_documented_one() -> None:
    own = Ownership(8, 3)
    assert [own.experts_of(r) for r in range(3)] == [range(3), range(3, 6), range(6, 8)]


def test_more_ranks_than_experts_is_refused_with_the_fix() -> None:
    with pytest.raises(OwnershipError, match=r"ep size 9 is larger than the 8 routed experts: use --ep-size <= 8"):
        Ownership(8, 9)


def test_bad_sizes_and_ranks_are_refused() -> None:
    with pytest.raises(OwnershipError):
        Ownership(8, 0)
    with pytest.raises(OwnershipError, match="rank 2 outside world size 2"):
        Ownership(8, 2).experts_of(2)
