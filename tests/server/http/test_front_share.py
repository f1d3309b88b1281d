"""Each of several HTTP processes' share of the queue (http/front_share.py): the shares sum to the whole, so
the queue never holds more than its capacity, and no process gets a tenant cap below one place."""

from __future__ import annotations

import pytest
from flotilla_server.http.front_share import FrontShare


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("total", [0, 1, 2, 5, 32, 33, 512])
def test_the_shares_sum_to_the_whole_and_differ_by_at_most_one(total: int, count: int) -> None:
    shares = [FrontShare(i, count).of(total) for i in range(count)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


@pytest.mark.parametrize(("cap", "count", "each"), [(None, 2, None), (1, 2, 1), (1, 4, 1), (4, 2, 2), (5, 2, 3),
                                                    (8, 3, 3)])
def test_a_tenant_cap_is_each_share_rounded_up_never_below_one(cap, count, each) -> None:
    assert {FrontShare(i, count).of_cap(cap) for i in range(count)} == {each}


@pytest.mark.parametrize(("index", "count"), [(2, 2), (-1, 2), (0, 0)])
def test_an_index_outside_the_processes_is_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="index must be in"):
        FrontShare(index, count)
