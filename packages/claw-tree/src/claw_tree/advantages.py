"""Advantage estimators: one pure numpy function per equation.

Outcome-based estimators work per rollout (one session = one vote, however many paths or calls
it has) and are broadcast to the rollout's trainable tokens by the sample packer. GAE works per
token on the tree.
"""

from __future__ import annotations

import numpy as np

from claw_tree.errors import ClawError

# PPO's GAE defaults, the one source of gae_on_tree's, build_samples', gae_for_samples' and
# `claw-tree samples`' (the README states them; tests/test_cli.py holds all of them to these):
# every generated token a time step (on a single chain that is the paper's GAE exactly, and
# each token's advantage is taken against the value of its own state, the finest baseline the
# critic gives; "turn" is the option), and gamma = lam = 1 so that a terminal reward reaches
# the first token (see gae_on_tree).
GAE_LEVEL = "token"
GAMMA = 1.0
LAM = 1.0


def _group_codes(groups: np.ndarray) -> tuple[np.ndarray, int]:
    _, codes = np.unique(np.asarray(groups), return_inverse=True)
    return codes.reshape(-1), int(codes.max()) + 1 if len(codes) else 0


def group_relative_advantages(
    rewards: np.ndarray, groups: np.ndarray, *, scale_by_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, sec. 4.1.2).

    A_i = (r_i - mean(r_g)) / (std(r_g) + eps) for rollout i in group g.

    rewards: (R,) one reward per rollout; groups: (R,) group key per rollout -> (R,).
    Deviations: ``scale_by_std=False`` drops the division (Liu et al. 2025, "Dr. GRPO");
    std is the population std (ddof=0); a group of one rollout, or whose rewards are all equal,
    gets advantage exactly 0 (not the rounding error of r - mean, which the std division would
    blow up to ~1e-11). Group-centred advantages sum to zero within each group.
    """
    r = np.asarray(rewards, dtype=np.float64)  # (R,)
    codes, n_groups = _group_codes(groups)
    count = np.bincount(codes, minlength=n_groups).astype(np.float64)  # (G,)
    mean = np.bincount(codes, weights=r, minlength=n_groups) / np.maximum(count, 1)  # (G,)
    centred = r - mean[codes]  # (R,)
    if scale_by_std:
        var = np.bincount(codes, weights=centred**2, minlength=n_groups) / np.maximum(count, 1)
        centred = centred / (np.sqrt(var)[codes] + eps)
    return np.where(_has_spread(r, codes, n_groups)[codes], centred, 0.0)


def _has_spread(r: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """(G,) True where a group's rewards are not all equal (so it has two rollouts or more)."""
    hi = np.full(n_groups, -np.inf)
    lo = np.full(n_groups, np.inf)
    np.maximum.at(hi, codes, r)
    np.minimum.at(lo, codes, r)
    return hi > lo


def rloo_advantages(rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - (1 / (n_g - 1)) * sum_{j in g, j != i} r_j.

    rewards, groups: (R,) -> (R,). A group of one rollout gets advantage 0 (no baseline exists),
    a group whose rewards are all equal exactly 0.
    """
    r = np.asarray(rewards, dtype=np.float64)  # (R,)
    codes, n_groups = _group_codes(groups)
    count = np.bincount(codes, minlength=n_groups).astype(np.float64)
    total = np.bincount(codes, weights=r, minlength=n_groups)
    n = count[codes]
    others = (total[codes] - r) / np.maximum(n - 1, 1)
    return np.where(_has_spread(r, codes, n_groups)[codes], r - others, 0.0)


def reinforce_advantages(rewards: np.ndarray, baseline: float = 0.0) -> np.ndarray:
    """Plain REINFORCE (Williams 1992): A_i = r_i - b with a constant baseline b (default 0).

    rewards: (R,) -> (R,).
    """
    return np.asarray(rewards, dtype=np.float64) - float(baseline)


def linear_scan(a: np.ndarray, c: np.ndarray, block: int = 64) -> np.ndarray:
    """Solve x_i = a_i + c_i * x_{i+1} backwards (x_n = 0); a, c: (n,) -> x: (n,).

    Blocked: each block of ``block`` entries is solved by a vectorised backward sweep over all
    blocks at once, giving x inside the block as loc + prod * (x entering from the next block);
    the block entries are the same recurrence on n / block values, solved recursively.
    c = 0 cuts the sequence, so many independent chains are solved in one call.
    """
    n = len(a)
    if n <= block:
        x = np.empty(n)
        nxt = 0.0
        for i in range(n - 1, -1, -1):
            nxt = a[i] + c[i] * nxt
            x[i] = nxt
        return x
    m = -(-n // block)
    A: np.ndarray = np.zeros(m * block)
    C: np.ndarray = np.zeros(m * block)
    A[:n], C[:n] = a, c
    A, C = A.reshape(m, block).T.copy(), C.reshape(m, block).T.copy()  # (block, m)
    loc = np.empty_like(A)
    prod = np.empty_like(A)
    run_loc, run_prod = np.zeros(m), np.ones(m)
    for j in range(block - 1, -1, -1):
        run_loc = A[j] + C[j] * run_loc
        run_prod = C[j] * run_prod
        loc[j], prod[j] = run_loc, run_prod
    starts = linear_scan(loc[0], prod[0], block)  # (m,) x at each block's first entry
    entering = np.append(starts[1:], 0.0)  # (m,)
    return (loc + prod * entering).T.reshape(-1)[:n]


def mean_child_recurrence(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve x_v = a_v + b_v * mean_{c in children(v)} x_c on a forest (mean over none = 0).

    parent: (N,) parent index, -1 for a root, parents precede children; a, b: (N,) -> x: (N,).
    Vectorised: the forest is cut into chains (runs where parent[j] == j - 1); chains are
    solved level by level from the deepest, each level with one blocked linear scan
    (:func:`linear_scan`), so no Python loop runs per node.
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if n == 0:
        return np.zeros(0)
    idx = np.arange(n)
    if (parent >= idx).any() or (parent < -1).any():
        raise ClawError("parent must point to an earlier node (or be -1)")
    n_children = np.bincount(parent[parent >= 0], minlength=n).astype(np.float64)  # (N,)
    head = parent != idx - 1  # (N,) first node of a chain
    head[0] = True
    run = np.cumsum(head) - 1  # (N,) chain id per node
    heads = np.flatnonzero(head)  # (K,)
    attach = parent[heads]  # (K,) node each chain hangs from, -1 for roots
    # Level of each chain: 0 for chains starting at a root, else 1 + level of the chain above.
    level = np.zeros(len(heads), dtype=np.int64)
    has_up = attach >= 0
    up = np.where(has_up, run[np.maximum(attach, 0)], 0)
    while True:
        new = np.where(has_up, level[up] + 1, 0)
        if np.array_equal(new, level):
            break
        level = new
    node_level = level[run]  # (N,)
    cont_next = np.zeros(n, dtype=bool)  # node v continues into v + 1 on the same chain
    cont_next[:-1] = ~head[1:]
    scale = np.divide(b, n_children, out=np.zeros(n), where=n_children > 0)  # (N,) b_v / |children|
    x = np.zeros(n)
    for lv in range(int(level.max()), -1, -1):
        # Sum of the (already solved) chain heads one level down, per attachment node.
        below = heads[(level == lv + 1)]
        extra = np.bincount(parent[below], weights=x[below], minlength=n) if len(below) else 0.0
        nodes = np.flatnonzero(node_level == lv)  # ascending, chains contiguous
        xs = (a + scale * extra)[nodes]
        coef = np.where(cont_next[nodes], scale[nodes], 0.0)
        xs = linear_scan(xs, coef)
        x[nodes] = xs
    return x


def gae_on_tree(
    parent: np.ndarray,
    trainable: np.ndarray,
    values: np.ndarray,
    rewards: np.ndarray,
    *,
    gamma: float = GAMMA,
    lam: float = LAM,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) on a token tree.

    Each trainable token is one action. For action v with value V_v and reward r_v:
        delta_v = r_v + mean_{c in children(v)} Q_c - V_v
        A_v     = delta_v + gamma * lam * mean_{c in children(v)} Ain_c
    where, for the next node c, Q_c = gamma * V_c and Ain_c = A_c if c is an action, and a
    context (non-policy) token u passes the signal through without a TD step of its own:
        Q_u = r_u + mean_c Q_c,   Ain_u = mean_c Ain_c.
    A leaf has no children (terminal: mean over none = 0). Returns are A_v + V_v.

    parent: (N,), trainable: (N,) bool, values: (N,), rewards: (N,) -> (advantages, returns),
    both (N,), 0 at context tokens.
    Deviations from the paper: (1) a branching node bootstraps from the mean over its children,
    which equals the average of per-path GAE weighted by the probability of reaching each leaf
    by a uniform random descent from the node; (2) context tokens are not time steps, so gamma
    discounts per generated token only; rewards on context tokens are credited, undiscounted,
    to the preceding action. On a single chain of actions this is exactly the paper's GAE.

    Defaults gamma = lam = 1 (as verl's PPO does for outcome rewards): an agent's reward arrives
    once, at the end, and must reach its first token. With V = 0 (a fresh value head) and one
    terminal reward R after T actions, A_t = (gamma * lam)^(T-1-t) * R: with lam = 0.95 the first
    token of a 1,000-token path gets 0.95^999 R = 5.6e-23 R, i.e. no credit. With lam = 1, A_t =
    R - V_t (the Monte Carlo return minus the baseline): unbiased, the critic only reduces
    variance; lower lam (0.95, Schulman et al.'s choice for dense rewards) trades bias for
    variance once the critic is good.
    """
    act = np.asarray(trainable, dtype=bool)
    V = np.asarray(values, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    parent = np.asarray(parent, dtype=np.int64)
    if not (len(parent) == len(act) == len(V) == len(r)):
        raise ClawError("gae_on_tree: parent, trainable, values and rewards must have one length")
    Q = mean_child_recurrence(parent, np.where(act, gamma * V, r), np.where(act, 0.0, 1.0))
    n_children = np.bincount(parent[parent >= 0], minlength=len(parent)).astype(np.float64)
    q_sum = np.bincount(parent[parent >= 0], weights=Q[parent >= 0], minlength=len(parent))
    next_q = np.divide(q_sum, n_children, out=np.zeros(len(parent)), where=n_children > 0)
    delta = np.where(act, r + next_q - V, 0.0)  # (N,)
    A = mean_child_recurrence(parent, delta, np.where(act, gamma * lam, 1.0))
    A = np.where(act, A, 0.0)
    return A, np.where(act, A + V, 0.0)


def turn_starts(parent: np.ndarray, trainable: np.ndarray) -> np.ndarray:
    """Index of the first token of each trainable token's turn; -1 at context tokens.

    A turn is a maximal run of trainable tokens down the tree (one call's completion): it starts
    at a trainable token whose parent is context or a root. parent, trainable: (N,) -> (N,).
    Vectorised by pointer jumping (log2(longest turn) rounds).
    """
    parent = np.asarray(parent, dtype=np.int64)
    act = np.asarray(trainable, dtype=bool)
    idx = np.arange(len(parent))
    inside = act & (parent >= 0) & act[np.maximum(parent, 0)]  # continues its parent's turn
    owner = np.where(inside, parent, idx)
    while True:
        nxt = owner[owner]
        if np.array_equal(nxt, owner):
            break
        owner = nxt
    return np.where(act, owner, -1)


def turn_gae_on_tree(
    parent: np.ndarray,
    trainable: np.ndarray,
    values: np.ndarray,
    rewards: np.ndarray,
    *,
    gamma: float = GAMMA,
    lam: float = LAM,
) -> tuple[np.ndarray, np.ndarray]:
    """Turn-level GAE on a token tree: one time step per turn (a call's completion), values at
    call boundaries.

    The turn starting at token s is one action, taken in the state before s, valued V_s:
        delta_s = r_turn + mean_{next turns} gamma * V_next - V_s,
        A_s     = delta_s + gamma * lam * mean_{next turns} A_next,
    exactly :func:`gae_on_tree` with the turn starts as the actions (the turn's other tokens pass
    rewards and bootstraps through, like context). Every token of the turn gets A_s and the
    return A_s + V_s. This is GAE (Schulman et al. 2016) with the turn as the time step, as in
    multi-turn agent RL (e.g. Zhou et al. 2024, "ArCHer", which assigns credit per utterance):
    the critic is read only where a decision starts, and gamma, lam discount per turn, not per
    token, so a terminal reward reaches early turns even with lam < 1 (lam^turns, not
    lam^tokens).

    parent, trainable, values, rewards: (N,) -> (advantages, returns), both (N,), 0 at context.
    Deviation: two completions with no context token between them count as one turn.
    """
    act = np.asarray(trainable, dtype=bool)
    start = turn_starts(parent, act)
    is_start = act & (start == np.arange(len(act)))
    A, R = gae_on_tree(parent, is_start, values, rewards, gamma=gamma, lam=lam)
    owner = np.maximum(start, 0)
    return np.where(act, A[owner], 0.0), np.where(act, R[owner], 0.0)
