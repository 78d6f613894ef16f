"""Tree-packed training samples (`claw.sample/v1`) with advantages and exact loss weights.

Loss weights. With R included rollouts (sessions), trajectories p (root-to-leaf paths of the
included sessions that hold at least one trainable token) and u_{p,v} >= 0, the share of path p
in its trainable token v, the packed weight of v is

    w_v = sum_{p containing v} u_{p,v},

so that for any per-token loss l, sum_v w_v l_v = sum_p sum_{v in p} u_{p,v} l_v: the loss of
the flat batch in which every path is its own sequence, exactly, while every shared token is
computed once. The weights of one batch sum to 1. ``path_weighting`` chooses u:

* ``"token"`` (default): u_{p,v} = 1 / (R * U_r * c_v), U_r = trainable tokens of rollout r,
  c_v = its paths through v. Each rollout's vote 1/R is spread evenly over the tokens its policy
  sampled: w_v = 1 / (R * U_r), every trainable token of a rollout weighs the same. Within a
  rollout this is DAPO's token-level loss (Yu et al. 2025, sec. 3.3: every token counts, so a
  long trajectory is not diluted per token), across rollouts one vote each (GRPO, Shao et al.
  2024). Why: a harness's rollout is one main conversation plus side calls (titles, token
  counts, sub-agents, compactions); splitting the vote per path gives three 10-token side calls
  75 % of the rollout's weight against a 2,000-token main path, and a one-token retokenization
  branch can move a turn from 1/7 to 1/2 of the vote. Per token, the work the policy did counts.
* ``"rollout"``: u_{p,v} = W_p / n_p with W_p = 1 / (R * n_paths(r)), n_p = trainable tokens of
  p: each rollout counts once and its paths share that vote equally, each path a mean over its
  tokens (GRPO's per-sequence mean applied per path).
* ``"path"``: W_p = 1 / P, the plain mean over all trajectories of their mean token loss.

Rollouts whose outcome is not ``ok`` (``infra_error``, ``not_scorable``), sessions without an
outcome and sessions without trainable tokens are left out and reported in
:attr:`SampleBatch.excluded`, never silently dropped. An ``ok`` rollout without calls or
without trainable tokens still votes in its group's statistics (it is a real outcome of the
policy) but contributes no tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from claw_tree.advantages import (
    GAE_LEVEL,
    GAMMA,
    LAM,
    gae_on_tree,
    group_relative_advantages,
    reinforce_advantages,
    rloo_advantages,
    turn_gae_on_tree,
)
from claw_tree.errors import BudgetError, ClawError, ConflictError, ValuesError
from claw_tree.records import SAMPLE_SCHEMA, Outcome, read_outcomes
from claw_tree.tree import Forest, Trajectory

log = logging.getLogger("claw_tree")

ALGOS = ("grpo", "ppo", "rloo", "reinforce")
GROUP_BY = ("group", "task", "task+harness")
PATH_WEIGHTING = ("token", "rollout", "path")
GAE_LEVELS = ("token", "turn")
PACKS = ("session", "group")


@attrs.frozen(kw_only=True)
class SampleBatch:
    """The samples of one batch and what was left out of it (session -> reason)."""

    samples: list[dict]
    excluded: dict[str, str]
    rollouts: int  # rollouts that voted in the group statistics
    trajectories: int  # trajectories that carry loss weight
    zero_spread_groups: list[str]  # groups whose rewards were all equal (advantage 0)

    @property
    def no_signal(self) -> str | None:
        """Why a learner would learn nothing from this batch, or None: no samples at all, or
        (critic-free algos, whose advantages are final here) every advantage 0. PPO's advantages
        come from the critic's values later, and SFT samples train on their NLL."""
        if not self.samples:
            return "no samples (every session was excluded)"
        critic_free = all(s["algo"] in ("grpo", "rloo", "reinforce") for s in self.samples)
        if critic_free and not any(
            a != 0
            for s in self.samples
            for a, t in zip(s["advantages"], s["trainable"], strict=True)
            if t
        ):
            return "every advantage is 0 (the rewards within each group are all equal)"
        return None

    def summary(self) -> str:
        """One human line (for stderr)."""
        tokens = sum(len(s["input_ids"]) for s in self.samples)
        text = (
            f"{len(self.samples)} samples, {tokens} tokens, {self.trajectories} trajectories "
            f"from {self.rollouts} rollouts"
        )
        if self.no_signal:
            text += f"; NO LEARNING SIGNAL: {self.no_signal}"
        if self.zero_spread_groups:
            text += f"; {len(self.zero_spread_groups)} groups with zero reward spread"
        if self.excluded:
            reasons: dict[str, int] = {}
            for why in self.excluded.values():
                reasons[why] = reasons.get(why, 0) + 1
            text += "; excluded sessions: " + ", ".join(
                f"{n} {why}" for why, n in sorted(reasons.items())
            )
        return text


def _outcomes_by_session(outcomes: Iterable[Outcome | dict] | str | Path) -> dict[str, Outcome]:
    if isinstance(outcomes, (str, Path)):
        outcomes = read_outcomes(outcomes).records
    out: dict[str, Outcome] = {}
    for i, item in enumerate(outcomes):
        oc = item if isinstance(item, Outcome) else Outcome.from_dict(item, f"<outcome {i}>")
        seen = out.get(oc.session)
        if seen is not None and seen != oc:
            raise ConflictError(f"session {oc.session!r} has two different outcomes")
        out[oc.session] = oc
    return out


def _group_key(oc: Outcome, group_by: str) -> str:
    if group_by == "group":
        return oc.group
    if group_by == "task":
        return oc.task
    return f"{oc.task}+{oc.harness}"


def _rollout_advantages(
    algo: str, rewards: np.ndarray, groups: list[str], *, scale_by_std: bool, baseline: float
) -> np.ndarray:
    if algo == "grpo":
        return group_relative_advantages(rewards, np.array(groups), scale_by_std=scale_by_std)
    if algo == "rloo":
        return rloo_advantages(rewards, np.array(groups))
    if algo == "reinforce":
        return reinforce_advantages(rewards, baseline)
    return np.zeros(len(rewards))


def _values_map(values: Mapping[str, Any] | Iterable[dict]) -> dict[str, np.ndarray]:
    if isinstance(values, Mapping):
        return {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    out = {}
    for i, row in enumerate(values):
        if not isinstance(row, dict) or "sample_id" not in row or "values" not in row:
            raise ValuesError(f"values row {i}: expected {{'sample_id': ..., 'values': [...]}}")
        out[str(row["sample_id"])] = np.asarray(row["values"], dtype=np.float64)
    return out


def _split_session(
    forest: Forest, start: int, stop: int, paths: list[Trajectory], max_tokens: int
) -> list[tuple[np.ndarray, list[Trajectory]]]:
    """Cut one session's paths into pieces of at most max_tokens unique nodes, whole paths only."""
    mask = np.zeros(stop - start, dtype=bool)
    pieces: list[tuple[np.ndarray, list[Trajectory]]] = []
    current: list[Trajectory] = []
    count = 0
    for path in paths:
        local = path.nodes() - start
        if len(local) > max_tokens:
            raise BudgetError(
                f"session {path.session!r}: trajectory {path.index} has {len(local)} tokens, more "
                f"than the budget of {max_tokens}; raise --max-tokens (paths are never cut)"
            )
        new = int((~mask[local]).sum())
        if current and count + new > max_tokens:
            pieces.append((start + np.flatnonzero(mask), current))
            mask[:] = False
            current, count, new = [], 0, len(local)
        mask[local] = True
        current.append(path)
        count += new
    if current:
        pieces.append((start + np.flatnonzero(mask), current))
    return pieces


def build_samples(
    forest: Forest,
    outcomes: Iterable[Outcome | dict] | str | Path,
    *,
    algo: str = "grpo",
    group_by: str = "group",
    scale_by_std: bool = True,
    path_weighting: str = "token",
    max_tokens: int | None = None,
    values: Mapping[str, Any] | Iterable[dict] | None = None,
    gamma: float = GAMMA,
    lam: float = LAM,
    gae_level: str = GAE_LEVEL,
    baseline: float = 0.0,
    id_prefix: str | None = None,
    pack: str = "session",
) -> SampleBatch:
    """Tree-pack the forest's rolled-out sessions into `claw.sample/v1` dicts.

    ``outcomes``: Outcome records, `claw.outcome/v1` dicts, or a JSONL path.

    One sample per session by default; with ``max_tokens`` several sessions share a sample up to
    that many tokens, and a session larger than the budget is split into pieces of whole
    root-to-leaf paths (shared ancestors repeat in each piece; loss weights stay exact).
    ``values`` (PPO only) maps each sample_id of this very batch to per-token critic values
    aligned with its tokens; without it GAE runs with V = 0 (Monte Carlo returns).
    ``gae_level``: ``"token"`` (:func:`gae_on_tree`, every generated token a time step) or
    ``"turn"`` (:func:`turn_gae_on_tree`, one time step per call, values at call boundaries).
    Sample ids are ``f"{id_prefix}-{k}"`` (prefix defaults to the algo); give each batch its own
    prefix when samples of several batches end up in one file.

    ``pack``: ``"session"`` (one tree per session) or ``"group"``: the rollouts of one group
    (the ``group_by`` key) go into one sample, and the context prefix they share (system prompt,
    tools, instruction: every token from a root down to the first trainable token) appears once
    (:func:`merge_context_prefixes`). Trainable tokens are never merged, so every loss weight,
    advantage and return is that of ``"session"`` packing and the loss is the same. With
    ``max_tokens`` a group larger than the budget spans several samples (whole sessions, or
    pieces of one), and small groups share a sample.
    """
    if algo not in ALGOS:
        raise ClawError(f"algo must be one of {ALGOS}, got {algo!r}")
    if group_by not in GROUP_BY:
        raise ClawError(f"group_by must be one of {GROUP_BY}, got {group_by!r}")
    if path_weighting not in PATH_WEIGHTING:
        raise ClawError(f"path_weighting must be one of {PATH_WEIGHTING}, got {path_weighting!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ClawError("max_tokens must be positive")
    if pack not in PACKS:
        raise ClawError(f"pack must be one of {PACKS}, got {pack!r}")
    if values is not None and algo != "ppo":
        raise ClawError("values are only used with algo='ppo'")
    gae = _gae_function(gae_level)
    by_session = _outcomes_by_session(outcomes)
    in_forest = {t.name for t in forest.sessions}
    excluded: dict[str, str] = {}
    for name in sorted(in_forest - set(by_session)):
        excluded[name] = "no outcome"
    voters = sorted(s for s, oc in by_session.items() if oc.status == "ok")
    for s, oc in sorted(by_session.items()):
        if oc.status != "ok":
            excluded[s] = f"status {oc.status}"
    for s in voters:
        if s not in in_forest:
            excluded[s] = "no calls"
    rewards = np.array([by_session[s].reward for s in voters], dtype=np.float64)
    groups = [_group_key(by_session[s], group_by) for s in voters]
    adv = _rollout_advantages(algo, rewards, groups, scale_by_std=scale_by_std, baseline=baseline)
    rollout_adv = dict(zip(voters, adv, strict=True))
    spread: dict[str, set[float]] = {}
    for g, r in zip(groups, rewards, strict=True):
        spread.setdefault(g, set()).add(float(r))
    zero_spread = sorted(g for g, rs in spread.items() if len(rs) == 1)

    cs = np.concatenate(([0], np.cumsum(forest.trainable)))
    included: list[tuple[Any, list[Trajectory], list[int]]] = []
    for tree in forest.sessions:
        if tree.name in excluded:
            continue
        paths, counts = [], []
        for ti in tree.trajectories:
            path = forest.trajectories[ti]
            n_p = int(sum(cs[b] - cs[a] for a, b in path.segments))
            if n_p > 0:
                paths.append(path)
                counts.append(n_p)
        if not paths:
            excluded[tree.name] = "no trainable tokens"
            continue
        included.append((tree, paths, counts))
    n_total_paths = sum(len(p) for _, p, _ in included)
    coef: dict[int, float] = {}  # trajectory index -> u_{p,v} (times node_scale[v])
    node_scale = np.ones(forest.n_nodes)
    if path_weighting == "token":  # 1 / c_v, c_v = included paths through v
        through = np.zeros(forest.n_nodes + 1)
        for _, paths, _ in included:
            for path in paths:
                for a, b in path.segments:
                    through[a] += 1.0
                    through[b] -= 1.0
        through = np.cumsum(through)[:-1]
        node_scale = np.divide(1.0, through, out=np.zeros(forest.n_nodes), where=through > 0)
    for tree, paths, counts in included:
        n_trainable = int(forest.trainable[tree.start : tree.stop].sum())
        for path, n_p in zip(paths, counts, strict=True):
            if path_weighting == "token":
                coef[path.index] = 1.0 / (len(included) * n_trainable)
            elif path_weighting == "path":
                coef[path.index] = 1.0 / (n_total_paths * n_p)
            else:
                coef[path.index] = 1.0 / (len(included) * len(paths) * n_p)

    # Plan: pieces (node ids + paths) -> samples (lists of pieces).
    if pack == "group":
        plans = _plan_groups(forest, included, by_session, group_by, max_tokens)
    else:
        plans = _plan_sessions(forest, included, max_tokens)
    sample_ids = [f"{id_prefix or algo}-{k}" for k in range(len(plans))]
    node_lists = [np.concatenate([nodes for _, nodes, _ in plan]) for plan in plans]
    where = np.full(forest.n_nodes, -1, dtype=np.int64)  # node id -> index in the current sample
    # per sample: parents over its node list; with pack="group", (kept tokens, merged parents)
    parents: list[np.ndarray] = []
    keeps: list[tuple[np.ndarray, np.ndarray] | None] = []
    for nodes in node_lists:
        where[nodes] = np.arange(len(nodes))
        gp = forest.parent[nodes]
        parents.append(np.where(gp >= 0, where[gp], -1))
        where[nodes] = -1
        if pack == "group":
            keeps.append(
                merge_context_prefixes(parents[-1], forest.trainable[nodes], forest.tokens[nodes])
            )
        else:
            keeps.append(None)
    sample_nodes = [n if k is None else n[k[0]] for n, k in zip(node_lists, keeps, strict=True)]

    leaf_reward = np.zeros(forest.n_nodes)
    for tree, _, _ in included:
        for ti in tree.trajectories:
            leaf_reward[forest.trajectories[ti].leaf] = by_session[tree.name].reward
    if algo == "ppo":
        V = np.zeros(forest.n_nodes)
        if values is not None:
            V = _scatter_values(forest.n_nodes, sample_ids, sample_nodes, _values_map(values))
        tok_adv, tok_ret = gae(
            forest.parent, forest.trainable, V, leaf_reward, gamma=gamma, lam=lam
        )

    samples = []
    for sid, plan, nodes, parent, merged in zip(
        sample_ids, plans, node_lists, parents, keeps, strict=True
    ):
        n = len(nodes)
        where[nodes] = np.arange(n)
        trainable = forest.trainable[nodes]
        diff = np.zeros(n + 1)
        starts, lens, cs_ = [], [], []
        for _, _, paths in plan:
            for path in paths:
                for a, b in path.segments:
                    starts.append(a)
                    lens.append(b - a)
                    cs_.append(coef[path.index])
        loc = where[np.array(starts, dtype=np.int64)]
        where[nodes] = -1
        np.add.at(diff, loc, cs_)
        np.add.at(diff, loc + np.array(lens), np.negative(cs_))
        weights = np.where(trainable, np.cumsum(diff)[:n] * node_scale[nodes], 0.0)
        session_index = np.concatenate([np.full(len(nd), k) for k, (_, nd, _) in enumerate(plan)])
        offsets = np.concatenate(([0], np.cumsum([len(nd) for _, nd, _ in plan])[:-1]))
        if algo == "ppo":
            advantages, returns = tok_adv[nodes], tok_ret[nodes]
        else:
            per_session = np.array([rollout_adv[tree.name] for tree, _, _ in plan])
            advantages, returns = np.where(trainable, per_session[session_index], 0.0), None
        if merged is not None:
            keep, parent = merged
            offsets = np.concatenate(([0], np.cumsum(keep)))[offsets]
            nodes, trainable, weights = nodes[keep], trainable[keep], weights[keep]
            advantages = advantages[keep]
            returns = None if returns is None else returns[keep]
        row: dict[str, Any] = {
            "schema": SAMPLE_SCHEMA,
            "sample_id": sid,
            "algo": algo,
            "input_ids": forest.tokens[nodes].tolist(),
            "position_ids": forest.depth[nodes].tolist(),
            "parent": parent.tolist(),
            "trainable": trainable.astype(np.int64).tolist(),
            "logprobs": forest.logprobs[nodes].tolist(),
            "advantages": advantages.tolist(),
        }
        if returns is not None:
            row["returns"] = returns.tolist()
        row.update(_sampling_arrays(forest, nodes))
        plan_sessions = [by_session[tree.name] for tree, _, _ in plan]
        row.update(
            {
                "loss_weights": weights.tolist(),
                "policy_versions": forest.policy_version[nodes].tolist(),
                "sessions": [oc.session for oc in plan_sessions],
                "groups": [_group_key(oc, group_by) for oc in plan_sessions],
                "n_paths": sum(len(paths) for _, _, paths in plan),
                "tags": {
                    "tasks": [oc.task for oc in plan_sessions],
                    "harnesses": [oc.harness for oc in plan_sessions],
                    "session_rewards": [oc.reward for oc in plan_sessions],
                    "session_offsets": offsets.tolist(),
                    "path_weighting": path_weighting,
                },
            }
        )
        if pack == "group":
            row["tags"]["pack"] = "group"
        samples.append(row)
    return SampleBatch(
        samples=samples,
        excluded=excluded,
        rollouts=len(voters),
        trajectories=n_total_paths,
        zero_spread_groups=zero_spread,
    )


Piece = tuple[Any, np.ndarray, list[Trajectory]]  # (session tree, its node ids, its paths)


def _pieces(forest: Forest, tree: Any, paths: list[Trajectory], max_tokens: int | None):
    """The session whole, or (larger than max_tokens) cut into pieces of whole paths."""
    if max_tokens is None or tree.n_nodes <= max_tokens:
        return [(tree, np.arange(tree.start, tree.stop), paths)]
    return [
        (tree, nodes, sub)
        for nodes, sub in _split_session(forest, tree.start, tree.stop, paths, max_tokens)
    ]


def _plan_sessions(
    forest: Forest, included: list[tuple[Any, list[Trajectory], list[int]]], max_tokens: int | None
) -> list[list[Piece]]:
    """One sample per session, or sessions packed greedily into samples of <= max_tokens."""
    plans: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for tree, paths, _ in included:
        if max_tokens is None:
            plans.append(_pieces(forest, tree, paths, None))
            continue
        if tree.n_nodes > max_tokens:
            plans.extend([piece] for piece in _pieces(forest, tree, paths, max_tokens))
            continue
        if current and size + tree.n_nodes > max_tokens:
            plans.append(current)
            current, size = [], 0
        current.append((tree, np.arange(tree.start, tree.stop), paths))
        size += tree.n_nodes
    if current:
        plans.append(current)
    return plans


def _plan_groups(
    forest: Forest,
    included: list[tuple[Any, list[Trajectory], list[int]]],
    by_session: dict[str, Outcome],
    group_by: str,
    max_tokens: int | None,
) -> list[list[Piece]]:
    """The sessions of each group together (groups in order of their first session); with
    max_tokens, consecutive pieces fill a sample while its merged size stays in budget."""
    groups: dict[str, list[tuple[Any, list[Trajectory]]]] = {}
    for tree, paths, _ in included:
        key = _group_key(by_session[tree.name], group_by)
        groups.setdefault(key, []).append((tree, paths))
    if max_tokens is None:
        return [
            [piece for tree, paths in members for piece in _pieces(forest, tree, paths, None)]
            for members in groups.values()
        ]
    pieces = (
        piece
        for members in groups.values()
        for tree, paths in members
        for piece in _pieces(forest, tree, paths, max_tokens)
    )
    return _fill_merged(forest, pieces, max_tokens)


def _fill_merged(forest: Forest, pieces: Iterable[Piece], max_tokens: int) -> list[list[Piece]]:
    """Consecutive pieces fill a sample while its size after merging the shared context
    prefixes stays within max_tokens (a piece that alone exceeds it gets its own sample)."""
    plans: list[list[Piece]] = []
    current: list[Piece] = []
    trie = _ContextTrie(forest)
    size = 0
    for piece in pieces:
        new = len(piece[1]) - trie.shared(piece[1])
        if current and size + new > max_tokens:
            plans.append(current)
            current, trie, size = [], _ContextTrie(forest), 0
            new = len(piece[1])
        trie.insert(piece[1])
        current.append(piece)
        size += new
    if current:
        plans.append(current)
    return plans


class _ContextTrie:
    """The context prefixes (root to first trainable token, leaves left out) of the pieces
    planned into one sample, as a trie over token ids: how many nodes a new piece would share
    with them (what :func:`merge_context_prefixes` will merge)."""

    def __init__(self, forest: Forest) -> None:
        self.children: dict[tuple[int, int], int] = {}
        self.forest = forest
        self.inner = np.zeros(forest.n_nodes, dtype=bool)  # has a child (pieces keep whole paths)
        self.inner[forest.parent[forest.parent >= 0]] = True

    def _walk(self, nodes: np.ndarray, insert: bool) -> int:
        ids: dict[int, int] = {}  # node id -> trie id, for context-prefix nodes
        shared = 0
        f = self.forest
        for v, p, tok, tr, inner in zip(
            nodes.tolist(),
            f.parent[nodes].tolist(),
            f.tokens[nodes].tolist(),
            f.trainable[nodes].tolist(),
            self.inner[nodes].tolist(),
            strict=True,
        ):
            if tr or not inner:
                continue
            up = ids.get(p) if p >= 0 else -1
            if up is None:  # below a trainable token: never shared
                continue
            tid = self.children.get((up, tok))
            if tid is not None:
                shared += 1
            elif insert:
                tid = self.children[(up, tok)] = len(self.children)
            else:
                continue
            ids[v] = tid
        return shared

    def shared(self, nodes: np.ndarray) -> int:
        return self._walk(nodes, insert=False)

    def insert(self, nodes: np.ndarray) -> None:
        self._walk(nodes, insert=True)


def merge_context_prefixes(
    parent: np.ndarray, trainable: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Merge the context prefixes of a packed tree: ``(keep, parent)``.

    A *context-prefix* token has no trainable token on its path from the root, itself included
    (the system prompt, tools and instruction the rollouts of a group share), and is no leaf. Two
    of them with the same token id and the same (merged) parent are one prefix-tree node; the
    later one is dropped and its children re-attached to the first. Leaves are never merged, so
    the paths (one per leaf) stay as they were. ``keep`` (shape (n,), bool) marks the
    tokens that stay, ``parent`` (shape (keep.sum(),)) is the parent array over them (parents
    still precede children). Trainable tokens and everything below them are never merged, so
    every path keeps its tokens, positions and trainable tokens, with the same ancestors: a
    per-token loss over the merged tree equals the loss over the unmerged one.
    """
    n = len(parent)
    rep = list(range(n))
    prefix = [False] * n
    inner = np.zeros(n, dtype=bool)
    inner[parent[parent >= 0]] = True
    children: dict[tuple[int, int], int] = {}
    for i, (p, tr, tok, has_child) in enumerate(
        zip(parent.tolist(), trainable.tolist(), tokens.tolist(), inner.tolist(), strict=True)
    ):
        if tr or not has_child or (p >= 0 and not prefix[p]):
            continue
        prefix[i] = True
        rep[i] = children.setdefault((rep[p] if p >= 0 else -1, tok), i)
    rep_a = np.asarray(rep, dtype=np.int64)
    keep = rep_a == np.arange(n)
    new_index = np.cumsum(keep) - 1
    merged_parent = np.where(parent >= 0, new_index[rep_a[parent]], -1)
    return keep, merged_parent[keep]


def _sampling_arrays(forest: Forest, nodes: np.ndarray) -> dict[str, list]:
    """``temperatures`` / ``top_ps`` / ``top_ks`` per token: the settings of the call that generated
    the token (1.0 / 1.0 / 0 for context), or nothing when every token has those defaults (so the
    samples of calls sampled at temperature 1 without truncation stay as they were)."""
    gen = forest.call[nodes]
    mine = gen[gen >= 0]
    if not any(not forest.calls[ci].default_sampling for ci in np.unique(mine)):
        return {}
    table = np.array([(c.temperature, c.top_p, c.top_k) for c in forest.calls] + [(1.0, 1.0, 0)])
    rows = table[np.where(gen >= 0, gen, len(forest.calls))]  # (n, 3); index -1 -> the defaults
    return {
        "temperatures": rows[:, 0].tolist(),
        "top_ps": rows[:, 1].tolist(),
        "top_ks": rows[:, 2].astype(np.int64).tolist(),
    }


def _scatter_values(
    n_nodes: int, sample_ids: list[str], node_lists: list[np.ndarray], values: dict[str, np.ndarray]
) -> np.ndarray:
    missing = [s for s in sample_ids if s not in values]
    extra = sorted(set(values) - set(sample_ids))
    if missing or extra:
        raise ValuesError(
            f"values do not match the samples: missing {missing[:5]}, unknown {extra[:5]} "
            "(build the samples with the same calls, outcomes and options as the values)"
        )
    total = np.zeros(n_nodes)
    count = np.zeros(n_nodes)
    for sid, nodes in zip(sample_ids, node_lists, strict=True):
        v = values[sid]
        if v.shape != nodes.shape:
            raise ValuesError(
                f"values for {sid!r}: {v.size} entries, the sample has {len(nodes)} tokens"
            )
        if not np.isfinite(v).all():
            raise ValuesError(f"values for {sid!r}: not all finite")
        np.add.at(total, nodes, v)
        np.add.at(count, nodes, 1.0)
    return np.divide(total, count, out=np.zeros(n_nodes), where=count > 0)


def make_samples(
    forest: Forest, outcomes: Iterable[Outcome | dict] | str | Path, **options: Any
) -> list[dict]:
    """`claw.sample/v1` dicts for the forest (see :func:`build_samples` for the options).

    Left-out sessions are logged (logger ``claw_tree``); use build_samples to get them back.
    """
    batch = build_samples(forest, outcomes, **options)
    if batch.excluded or batch.no_signal:
        log.warning("claw-tree samples: %s", batch.summary())
    return batch.samples


def token_sessions(sample: dict) -> np.ndarray:
    """Index into ``sample["sessions"]`` of every token, from ``tags["session_offsets"]``."""
    offsets = (sample.get("tags") or {}).get("session_offsets")
    if offsets is None:
        raise ValuesError(
            f"sample {sample.get('sample_id')!r} has no tags.session_offsets (not made by claw-tree?)"
        )
    n = len(sample["input_ids"])
    return np.searchsorted(np.asarray(offsets), np.arange(n), side="right") - 1


def sample_rewards(sample: dict) -> np.ndarray:
    """Per-token rewards of a sample: its session's outcome reward on every leaf, 0 elsewhere."""
    parent = np.asarray(sample["parent"], dtype=np.int64)
    n = len(parent)
    is_leaf = np.ones(n, dtype=bool)
    is_leaf[parent[parent >= 0]] = False
    per_session = np.asarray(sample["tags"]["session_rewards"] if n else [], dtype=np.float64)
    return np.where(is_leaf, per_session[token_sessions(sample)] if n else 0.0, 0.0)


def _gae_function(gae_level: str):
    if gae_level not in GAE_LEVELS:
        raise ClawError(f"gae_level must be one of {GAE_LEVELS}, got {gae_level!r}")
    return gae_on_tree if gae_level == "token" else turn_gae_on_tree


def gae_for_samples(
    samples: Iterable[dict],
    values: Mapping[str, Any] | Iterable[dict],
    *,
    gamma: float = GAMMA,
    lam: float = LAM,
    gae_level: str = GAE_LEVEL,
) -> list[dict]:
    """Fill ``advantages`` and ``returns`` of PPO samples from per-token critic values.

    Works on each sample's own tree (``parent``, ``trainable``, ``rewards``); a session split
    over several samples bootstraps only from the children present in each piece (use
    build_samples(values=...) to run GAE on the whole tree instead).
    """
    gae = _gae_function(gae_level)
    vmap = _values_map(values)
    out = []
    for sample in samples:
        sid = sample.get("sample_id")
        if sid not in vmap:
            raise ValuesError(f"no values for sample {sid!r}")
        V = vmap[sid]
        if len(V) != len(sample["input_ids"]):
            raise ValuesError(
                f"values for {sid!r}: {len(V)} entries, the sample has {len(sample['input_ids'])} tokens"
            )
        A, R = gae(
            np.asarray(sample["parent"]),
            np.asarray(sample["trainable"], dtype=bool),
            V,
            sample_rewards(sample),
            gamma=gamma,
            lam=lam,
        )
        out.append({**sample, "advantages": A.tolist(), "returns": R.tolist()})
    return out
