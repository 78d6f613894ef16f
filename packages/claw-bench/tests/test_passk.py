"""Pass@k: the unbiased estimator equals brute-force enumeration; bootstrap intervals behave."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from claw_bench import ClawError, pass_at_k, pass_at_k_brute
from claw_bench.passk import bootstrap_mean_ci, bootstrap_task_ci
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.data())
def test_estimator_equals_brute_force(results, data):
    """For any pass pattern and k <= n, the closed form equals the fraction of k-subsets with a pass."""
    k = data.draw(st.integers(1, len(results)))
    assert math.isclose(
        pass_at_k(len(results), sum(results), k), pass_at_k_brute(results, k), abs_tol=1e-12
    )


def test_exhaustive_small_cases_and_known_values():
    """All patterns up to n=6 agree; pass@1 is c/n; a few values checked by hand."""
    for n in range(1, 7):
        for pattern in itertools.product([False, True], repeat=n):
            for k in range(1, n + 1):
                assert math.isclose(
                    pass_at_k(n, sum(pattern), k), pass_at_k_brute(list(pattern), k)
                )
        for c in range(n + 1):
            assert math.isclose(pass_at_k(n, c, 1), c / n)
    assert math.isclose(pass_at_k(4, 2, 2), 5 / 6)
    assert math.isclose(pass_at_k(4, 1, 2), 0.5)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0


def test_invalid_arguments():
    """k larger than n, or c outside [0, n], is an error rather than a silent number."""
    for n, c, k in [(3, 1, 4), (3, 4, 1), (3, -1, 1), (3, 1, 0)]:
        with pytest.raises(ClawError):
            pass_at_k(n, c, k)


def test_bootstrap_intervals():
    """The CI brackets the point estimate, narrows with more data, and is degenerate for constant data."""
    rng = np.random.default_rng(1)
    small = rng.random(10)
    big = rng.random(1000)
    lo, hi = bootstrap_mean_ci(small)
    assert lo <= small.mean() <= hi
    blo, bhi = bootstrap_mean_ci(big)
    assert (bhi - blo) < (hi - lo)
    assert bootstrap_mean_ci(np.ones(5)) == (1.0, 1.0)
    lo, hi = bootstrap_task_ci(np.array([1, 0, 1, 0]), 1)
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
    assert bootstrap_task_ci(np.array([1, 1, 1]), 2) == (1.0, 1.0)
