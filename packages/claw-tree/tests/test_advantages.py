"""Advantage estimators against plain loops: GRPO, RLOO, REINFORCE, tree GAE."""

import numpy as np
import pytest
from claw_tree import (
    ClawError,
    gae_on_tree,
    group_relative_advantages,
    linear_scan,
    mean_child_recurrence,
    reinforce_advantages,
    rloo_advantages,
    turn_gae_on_tree,
    turn_starts,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_testlib import flat_gae

rewards_and_groups = st.lists(
    st.tuples(st.floats(0, 1, allow_nan=False), st.sampled_from("abcd")), min_size=1, max_size=30
)


@settings(max_examples=200, deadline=None)
@given(rewards_and_groups, st.booleans())
def test_grpo_matches_loop_and_sums_to_zero_per_group(rows, scale):
    """GRPO equals a per-group loop and group-centred advantages sum to zero in every group."""
    r = np.array([x for x, _ in rows])
    g = np.array([k for _, k in rows])
    got = group_relative_advantages(r, g, scale_by_std=scale)
    for key in set(g):
        members = [i for i in range(len(r)) if g[i] == key]
        vals = [r[i] for i in members]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
        for i in members:
            want = 0.0 if len(members) == 1 else (r[i] - mean) / ((std + 1e-6) if scale else 1.0)
            assert got[i] == pytest.approx(want, abs=1e-9)
        assert abs(sum(got[i] for i in members)) < 1e-6


@settings(max_examples=200, deadline=None)
@given(rewards_and_groups)
def test_rloo_matches_leave_one_out_loop(rows):
    """RLOO: each rollout's baseline is the mean of the other rollouts of its group."""
    r = np.array([x for x, _ in rows])
    g = [k for _, k in rows]
    got = rloo_advantages(r, np.array(g))
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if j != i and g[j] == g[i]]
        want = r[i] - sum(others) / len(others) if others else 0.0
        assert got[i] == pytest.approx(want, abs=1e-9)


def test_a_group_of_equal_rewards_gets_exactly_zero():
    """Equal rewards give advantage exactly 0 (no learning signal), not the rounding error of
    r - mean (0.1 three times: mean 0.10000000000000002) scaled up by 1 / (std + eps)."""
    r = np.array([0.1, 0.1, 0.1, 1.0, 0.0])
    g = np.array(["a", "a", "a", "b", "b"])
    for scale in (True, False):
        got = group_relative_advantages(r, g, scale_by_std=scale)
        assert got[:3].tolist() == [0.0, 0.0, 0.0] and got[3] > 0 > got[4]
    got = rloo_advantages(r, g)
    assert got[:3].tolist() == [0.0, 0.0, 0.0] and got[3] == 1.0


def test_reinforce_subtracts_a_constant_baseline():
    """REINFORCE is the reward minus the constant baseline."""
    assert reinforce_advantages(np.array([1.0, 0.0]), baseline=0.25).tolist() == [0.75, -0.25]


@st.composite
def random_trees(draw, max_nodes=40):
    """A random forest in parent-before-child order, mostly chains, with random flags/values."""
    n = draw(st.integers(1, max_nodes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    parent = np.full(n, -1)
    for j in range(1, n):
        u = rng.random()
        parent[j] = j - 1 if u < 0.7 else (-1 if u < 0.75 else rng.integers(0, j))
    act = rng.random(n) < 0.6
    V = rng.normal(size=n)
    leaves = np.ones(n, dtype=bool)
    leaves[parent[parent >= 0]] = False
    r = np.where(leaves, rng.random(n), 0.0)
    if draw(st.booleans()):
        r = r + np.where(rng.random(n) < 0.2, rng.normal(size=n), 0.0)  # rewards mid-path too
    return parent, act, V, r


def _children(parent):
    kids = {i: [] for i in range(len(parent))}
    for j, p in enumerate(parent):
        if p >= 0:
            kids[p].append(j)
    return kids


@settings(max_examples=200, deadline=None)
@given(random_trees(max_nodes=400), st.floats(0, 1), st.floats(0, 1))
def test_mean_child_recurrence_matches_reverse_loop(tree, b0, b1):
    """x_v = a_v + b_v * mean(children x) solved vectorised equals a plain reverse loop."""
    parent, act, V, _ = tree
    a = V
    b = np.where(act, b0, b1)
    kids = _children(parent)
    want = np.zeros(len(parent))
    for v in range(len(parent) - 1, -1, -1):
        want[v] = a[v] + (b[v] * np.mean([want[c] for c in kids[v]]) if kids[v] else 0.0)
    assert np.allclose(mean_child_recurrence(parent, a, b), want)


@settings(max_examples=200, deadline=None)
@given(random_trees(), st.floats(0, 1), st.floats(0, 1))
def test_tree_gae_is_descent_weighted_per_path_gae(tree, gamma, lam):
    """Tree GAE at a token equals the average over the leaves below it of that path's flat GAE,
    each leaf weighted by the chance of reaching it by a uniform random descent."""
    parent, act, V, r = tree
    A, R = gae_on_tree(parent, act, V, r, gamma=gamma, lam=lam)
    kids = _children(parent)

    def leaves_below(v, prob):
        if not kids[v]:
            yield v, prob
        for c in kids[v]:
            yield from leaves_below(c, prob / len(kids[v]))

    def path_to(v):
        out = []
        while v >= 0:
            out.append(v)
            v = parent[v]
        return out[::-1]

    want = np.zeros(len(parent))
    for v in range(len(parent)):
        if not act[v]:
            continue
        for leaf, prob in leaves_below(v, 1.0):
            path = path_to(leaf)
            flat = flat_gae(act[path], V[path], r[path], gamma, lam)
            want[v] += prob * flat[path.index(v)]
    assert np.allclose(A, want)
    assert np.allclose(R, np.where(act, A + V, 0.0))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.floats(0, 1), st.floats(0, 1), st.integers(0, 2**32 - 1))
def test_single_chain_is_textbook_gae(n, gamma, lam, seed):
    """A chain of generated tokens gives GAE exactly as in Schulman et al. 2016 (double sum)."""
    rng = np.random.default_rng(seed)
    V, r = rng.normal(size=n), rng.normal(size=n)
    parent = np.arange(n) - 1
    A, R = gae_on_tree(parent, np.ones(n, dtype=bool), V, r, gamma=gamma, lam=lam)
    V_next = np.append(V[1:], 0.0)
    delta = r + gamma * V_next - V
    want = np.array(
        [sum((gamma * lam) ** k * delta[t + k] for k in range(n - t)) for t in range(n)]
    )
    assert np.allclose(A, want)
    assert np.allclose(R, A + V)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.sampled_from([0.0, 0.5, 0.9, 1.0])), max_size=300),
    st.integers(2, 70),
)
def test_blocked_linear_scan_matches_loop(rows, block):
    """x_i = a_i + c_i x_{i+1} solved in blocks (recursively) equals the backward loop."""
    a = np.array([x for x, _ in rows])
    c = np.array([y for _, y in rows])
    want = np.zeros(len(a))
    nxt = 0.0
    for i in range(len(a) - 1, -1, -1):
        nxt = want[i] = a[i] + c[i] * nxt
    assert np.allclose(linear_scan(a, c, block), want)


def test_long_chain_does_not_overflow():
    """A 200k-token chain with gamma*lam < 1 stays finite and matches the closed form."""
    n = 200_000
    A, _ = gae_on_tree(
        np.arange(n) - 1,
        np.ones(n, dtype=bool),
        np.zeros(n),
        np.r_[np.zeros(n - 1), 1.0],
        gamma=1.0,
        lam=0.95,
    )
    assert np.isfinite(A).all()
    assert np.allclose(A, 0.95 ** np.arange(n - 1, -1, -1))


def test_default_lambda_lets_a_terminal_reward_reach_the_first_token():
    """Defaults (gamma = lam = 1), V = 0, reward 1 at the end of a 1,000-token chain after a
    prompt: every token's advantage is 1 (with lam = 0.95 the first would get 0.95^999)."""
    n_prompt, n = 5, 1005
    trainable = np.r_[np.zeros(n_prompt, dtype=bool), np.ones(n - n_prompt, dtype=bool)]
    A, R = gae_on_tree(np.arange(n) - 1, trainable, np.zeros(n), np.r_[np.zeros(n - 1), 1.0])
    assert np.allclose(A[trainable], 1.0) and np.allclose(R[trainable], 1.0)
    A95, _ = gae_on_tree(
        np.arange(n) - 1, trainable, np.zeros(n), np.r_[np.zeros(n - 1), 1.0], lam=0.95
    )
    assert A95[n_prompt] == pytest.approx(0.95**999) and A95[n_prompt] < 1e-20


def _turn_gae_loop(act, V, r, gamma, lam):
    """Reference on one chain: turns are maximal runs of trainable tokens; turn k collects the
    rewards from its start to the next turn's start; plain GAE over the turns, broadcast."""
    starts = [t for t in range(len(act)) if act[t] and (t == 0 or not act[t - 1])]
    if not starts:
        return np.zeros(len(act))
    bounds = [*starts[1:], len(act)]
    rew = [float(np.sum(r[a:b])) for a, b in zip(starts, bounds, strict=True)]
    # rewards before the first turn have no action to go to
    A_turn, nxt_A, nxt_V = [0.0] * len(starts), 0.0, 0.0
    for k in range(len(starts) - 1, -1, -1):
        delta = rew[k] + gamma * nxt_V - V[starts[k]]
        A_turn[k] = delta + gamma * lam * nxt_A
        nxt_A, nxt_V = A_turn[k], V[starts[k]]
    A = np.zeros(len(act))
    for k, (a, b) in enumerate(zip(starts, bounds, strict=True)):
        A[a:b] = np.where(act[a:b], A_turn[k], 0.0)
    return A


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.floats(-1, 1), st.floats(-1, 1)), min_size=1, max_size=40),
    st.floats(0.5, 1.0),
    st.floats(0.0, 1.0),
)
def test_turn_gae_on_a_chain_is_gae_over_turns(rows, gamma, lam):
    """Turn-level GAE on a chain equals a loop over the turns (values read at turn starts)."""
    act = np.array([a for a, _, _ in rows])
    act[0] = False  # a root is context
    V = np.array([v for _, v, _ in rows])
    r = np.array([x for _, _, x in rows])
    n = len(rows)
    A, R = turn_gae_on_tree(np.arange(n) - 1, act, V, r, gamma=gamma, lam=lam)
    assert np.allclose(A, _turn_gae_loop(act, V, r, gamma, lam))
    starts = turn_starts(np.arange(n) - 1, act)
    assert np.allclose(R, np.where(act, A + V[np.maximum(starts, 0)], 0.0))


def test_turn_gae_discounts_per_turn():
    """Three turns of 50 tokens, V = 0, terminal reward 1, lam = 0.9: turn k gets 0.9^(2-k)."""
    act = np.r_[[False] * 3, [True] * 50, [False] * 2, [True] * 50, [False] * 2, [True] * 50]
    n = len(act)
    A, _ = turn_gae_on_tree(
        np.arange(n) - 1, act, np.zeros(n), np.r_[np.zeros(n - 1), 1.0], lam=0.9
    )
    assert sorted(set(np.round(A[act], 12))) == pytest.approx([0.81, 0.9, 1.0])
    assert A[3] == pytest.approx(0.81) and A[-1] == pytest.approx(1.0)


def test_bad_parent_array_is_rejected():
    """A parent that does not precede its child is a clear error."""
    with pytest.raises(ClawError, match="earlier node"):
        mean_child_recurrence(np.array([-1, 2, 0]), np.zeros(3), np.ones(3))
