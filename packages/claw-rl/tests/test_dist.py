"""claw_rl._dist.assign: samples go to data-parallel ranks balanced by token count, the same
split on every rank."""

from __future__ import annotations

import random

import pytest
from claw_rl import _dist


def _loads(sizes: list[int], split: list[list[int]]) -> list[int]:
    return [sum(sizes[k] for k in ks) for ks in split]


def test_assign_balances_tokens_within_one_sample():
    """Every sample lands on exactly one rank; max rank tokens <= min + the largest sample."""
    rng = random.Random(0)
    for _ in range(300):
        ranks = rng.randint(1, 8)
        n = rng.randint(0, 20)
        # group-packed batches: a few large samples among many small ones
        sizes = [rng.choice([rng.randint(1, 300), rng.randint(2000, 30000)]) for _ in range(n)]
        split = _dist.assign(sizes, ranks)
        assert len(split) == ranks
        assert sorted(k for ks in split for k in ks) == list(range(n))
        assert all(ks == sorted(ks) for ks in split)
        loads = _loads(sizes, split)
        assert max(loads) <= min(loads) + max(sizes, default=0)
        if n >= ranks:  # a rank owns nothing only when samples are fewer than ranks
            assert all(split)


def test_assign_beats_round_robin_on_group_samples():
    """Two large group samples next to small ones go to different ranks (round robin by index
    would put both on rank 0)."""
    sizes = [9000, 100, 8000, 120, 90, 110]
    split = _dist.assign(sizes, 2)
    assert split == [[0], [1, 2, 3, 4, 5]]
    assert max(_loads(sizes, split)) == 9000
    round_robin = [[k for k in range(6) if k % 2 == r] for r in range(2)]
    assert max(_loads(sizes, round_robin)) == 17090


def test_own_is_the_same_split_on_every_rank(monkeypatch):
    """Each rank's own() is its part of one deterministic split: disjoint, covering the batch,
    and unchanged when recomputed (ties broken by index, then rank)."""
    sizes = [50, 50, 50, 50, 700, 3, 3]
    shares = []
    for rank in range(3):
        monkeypatch.setattr(_dist, "world", lambda rank=rank: (rank, 3))
        shares.append(_dist.own(sizes))
    assert shares == _dist.assign(sizes, 3) == _dist.assign(list(sizes), 3)
    assert sorted(k for ks in shares for k in ks) == list(range(len(sizes)))
    assert shares[0] == [4]  # the largest sample alone on the first rank


def test_own_outside_torchrun_is_everything():
    """One process forwards the whole batch, in index order."""
    assert _dist.own([5, 1, 9]) == [0, 1, 2]


def test_assign_rejects_no_ranks():
    """Zero ranks is an error, not an empty split."""
    with pytest.raises(ValueError, match="ranks"):
        _dist.assign([1, 2], 0)
