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
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from claw_tree._packing import (
    Kept,
    Packed,
    Piece,
    as_lists,
    lay_out,
    merge_context_prefixes,
    outcomes_by_session,
    paths_through,
    plan_groups,
    plan_sessions,
    sample_head,
    trainable_sessions,
    with_pack_tag,
    with_routing,
)
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
from claw_tree.errors import ClawError, ValuesError
from claw_tree.options import ALGOS, GAE_LEVELS, GROUP_BY, PACKS, PATH_WEIGHTING, SampleOptions
from claw_tree.records import Outcome
from claw_tree.routing import RoutingOut, store_routing
from claw_tree.tree import Forest, SessionTree

log = logging.getLogger("claw_tree")

__all__ = [
    "ALGOS",
    "GAE_LEVELS",
    "GROUP_BY",
    "PACKS",
    "PATH_WEIGHTING",
    "Piece",
    "SampleBatch",
    "SampleOptions",
    "SampleTally",
    "build_samples",
    "gae_for_samples",
    "make_samples",
    "merge_context_prefixes",
    "sample_rewards",
    "stream_samples",
    "token_sessions",
]


@attrs.frozen(kw_only=True)
class SampleBatch:
    """The samples of one batch and what was left out of it (session -> reason)."""

    samples: list[dict]
    excluded: dict[str, str]
    rollouts: int  # rollouts that voted in the group statistics
    trajectories: int  # trajectories that carry loss weight (-1: counted by a SampleTally)
    zero_spread_groups: list[str]  # groups whose rewards were all equal (advantage 0)

    @property
    def no_signal(self) -> str | None:
        """Why a learner would learn nothing from this batch, or None: no samples at all, or
        (critic-free algos, whose advantages are final here) every advantage 0. PPO's advantages
        come from the critic's values later, and SFT samples train on their NLL."""
        return SampleTally.of(self.samples).no_signal()

    def summary(self, tally: SampleTally | None = None) -> str:
        """One human line (for stderr). ``tally``: what was counted of the samples written one
        at a time (:func:`stream_samples`; this batch's own ``samples`` are then empty)."""
        tally = tally or SampleTally.of(self.samples)
        no_signal = tally.no_signal()
        trajectories = self.trajectories if self.trajectories >= 0 else tally.trajectories
        text = (
            f"{tally.samples} samples, {tally.tokens} tokens, {trajectories} trajectories "
            f"from {self.rollouts} rollouts"
        )
        if no_signal:
            text += f"; NO LEARNING SIGNAL: {no_signal}"
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


@attrs.define
class SampleTally:
    """What :meth:`SampleBatch.summary` needs of the samples, counted one sample at a time (so
    that samples can be written as they are made, none of them held)."""

    samples: int = 0
    tokens: int = 0
    trajectories: int = 0  # the samples' n_paths, summed
    critic_free: bool = True  # every sample's advantages are final (grpo, rloo, reinforce)
    signal: bool = False  # some trainable token has a nonzero advantage

    @classmethod
    def of(cls, samples: Iterable[dict]) -> SampleTally:
        tally = cls()
        for row in samples:
            tally.add(row)
        return tally

    def add(self, row: dict) -> dict:
        """Count one sample; return it."""
        self.samples += 1
        self.tokens += len(row["input_ids"])
        self.trajectories += int(row.get("n_paths", 0))
        if row["algo"] not in ("grpo", "rloo", "reinforce"):
            self.critic_free = False
        elif self.critic_free and not self.signal:
            trainable = np.asarray(row["trainable"]) != 0
            self.signal = bool(np.any(np.asarray(row["advantages"])[trainable] != 0))
        return row

    def counted(self, rows: Iterable[dict]) -> Iterator[dict]:
        """``rows``, each counted as it passes."""
        for row in rows:
            yield self.add(row)

    def no_signal(self) -> str | None:
        """See :attr:`SampleBatch.no_signal`."""
        if not self.samples:
            return "no samples (every session was excluded)"
        if self.critic_free and not self.signal:
            return "every advantage is 0 (the rewards within each group are all equal)"
        return None


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


@attrs.frozen(kw_only=True, eq=False)
class _Votes:
    """Stage 1: which rollouts vote in the group statistics, what they get, what is left out."""

    by_session: dict[str, Outcome]
    voters: list[str]  # ok rollouts, sorted
    excluded: dict[str, str]  # session -> reason
    rollout_adv: dict[str, float]  # critic-free advantage of each voter (0 for PPO)
    zero_spread: list[str]  # groups whose rewards were all equal


@attrs.frozen(kw_only=True, eq=False)
class _Weights:
    """Stage 3: u_{p,v} = coef[p] * node_scale[v] for every kept path p and node v."""

    coef: dict[int, float]  # trajectory index -> coefficient
    node_scale: np.ndarray  # (N,)
    n_paths: int  # kept paths: trajectories that carry loss weight


def _votes(in_forest: set[str], by_session: dict[str, Outcome], opts: SampleOptions) -> _Votes:
    """``in_forest``: the sessions that have calls."""
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
    groups = [_group_key(by_session[s], opts.group_by) for s in voters]
    adv = _rollout_advantages(
        opts.algo, rewards, groups, scale_by_std=opts.scale_by_std, baseline=opts.baseline
    )
    spread: dict[str, set[float]] = {}
    for g, r in zip(groups, rewards, strict=True):
        spread.setdefault(g, set()).add(float(r))
    return _Votes(
        by_session=by_session,
        voters=voters,
        excluded=excluded,
        rollout_adv=dict(zip(voters, adv, strict=True)),
        zero_spread=sorted(g for g, rs in spread.items() if len(rs) == 1),
    )


def _weights(
    forest: Forest,
    kept: list[Kept],
    weighting: str,
    *,
    n_kept: int | None = None,
    n_paths: int | None = None,
) -> _Weights:
    """``n_kept`` / ``n_paths``: the kept sessions and paths of the whole batch when ``kept``
    is only a part of it (:mod:`claw_tree.corpus`; default: ``kept`` is the batch)."""
    n_paths = sum(len(k.paths) for k in kept) if n_paths is None else n_paths
    n_kept = len(kept) if n_kept is None else n_kept
    node_scale = np.ones(forest.n_nodes)
    if weighting == "token":  # 1 / c_v, c_v = kept paths through v
        through = paths_through(forest, kept)
        node_scale = np.divide(1.0, through, out=np.zeros(forest.n_nodes), where=through > 0)
    coef: dict[int, float] = {}
    for k in kept:
        n_trainable = int(forest.trainable[k.tree.start : k.tree.stop].sum())
        for path, n_p in zip(k.paths, k.counts, strict=True):
            if weighting == "token":
                coef[path.index] = 1.0 / (n_kept * n_trainable)
            elif weighting == "path":
                coef[path.index] = 1.0 / (n_paths * n_p)
            else:
                coef[path.index] = 1.0 / (n_kept * len(k.paths) * n_p)
    return _Weights(coef=coef, node_scale=node_scale, n_paths=n_paths)


def _plan(
    forest: Forest, kept: list[Kept], votes: _Votes, opts: SampleOptions
) -> list[list[Piece]]:
    """Stage 4: pieces (node ids + paths) -> samples (lists of pieces)."""
    if opts.pack == "session":
        return plan_sessions(forest, kept, opts.max_tokens)

    def group(tree: SessionTree) -> str:
        return _group_key(votes.by_session[tree.name], opts.group_by)

    if opts.pack == "group":
        return plan_groups(forest, kept, group, opts.max_tokens)
    # batch: one bucket per harness, its groups one after the other (their instructions merge)
    first: dict[str, int] = {}
    for k in kept:
        first.setdefault(group(k.tree), len(first))
    in_groups = sorted(kept, key=lambda k: first[group(k.tree)])
    return plan_groups(
        forest, in_groups, lambda tree: votes.by_session[tree.name].harness, opts.max_tokens
    )


def _token_advantages(
    forest: Forest,
    kept: list[Kept],
    votes: _Votes,
    packed: Iterable[Packed],
    values: Mapping[str, Any] | Iterable[dict] | None,
    opts: SampleOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 5 (PPO): GAE on the whole forest, the leaves of a session rewarded with its outcome;
    V from ``values`` (per sample, averaged where a node is in several samples) or 0."""
    leaf_reward = np.zeros(forest.n_nodes)
    for k in kept:
        for ti in k.tree.trajectories:
            leaf_reward[forest.trajectories[ti].leaf] = votes.by_session[k.tree.name].reward
    V = np.zeros(forest.n_nodes)
    if values is not None:
        assert isinstance(packed, list)
        V = _scatter_values(
            forest.n_nodes,
            [p.sample_id for p in packed],
            [p.final_nodes for p in packed],
            _values_map(values),
        )
    gae = _gae_function(opts.gae_level)
    return gae(forest.parent, forest.trainable, V, leaf_reward, gamma=opts.gamma, lam=opts.lam)


def _sample_row(
    forest: Forest,
    p: Packed,
    votes: _Votes,
    weights: _Weights,
    tokens: tuple[np.ndarray, np.ndarray] | None,
    opts: SampleOptions,
) -> dict[str, Any]:
    """Stage 6: one `claw.sample/v1` dict."""
    nodes = p.nodes
    trainable = forest.trainable[nodes]
    loss = np.where(
        trainable,
        p.path_sums([weights.coef[t] for t in p.seg_traj.tolist()]) * weights.node_scale[nodes],
        0.0,
    )
    if tokens is not None:
        per_token = [tokens[0][nodes], tokens[1][nodes]]  # advantages, returns
    else:
        per_piece = np.array([votes.rollout_adv[tree.name] for tree in p.trees])
        per_token = [np.where(trainable, per_piece[p.piece_index], 0.0)]
    parent, (nodes, loss, advantages, *returns), offsets = p.merged(nodes, loss, *per_token)
    row = sample_head(forest, p.sample_id, opts.algo, nodes, parent)
    row["advantages"] = advantages
    if returns:
        row["returns"] = returns[0]
    row.update(_sampling_arrays(forest, nodes))
    row.update(_kept_array(forest, nodes))
    sessions = [votes.by_session[tree.name] for tree in p.trees]
    row["loss_weights"] = loss
    row["policy_versions"] = forest.policy_version[nodes]
    row["sessions"] = [oc.session for oc in sessions]
    row["groups"] = [_group_key(oc, opts.group_by) for oc in sessions]
    row["n_paths"] = p.n_paths
    row["tags"] = {
        "tasks": [oc.task for oc in sessions],
        "harnesses": [oc.harness for oc in sessions],
        "session_rewards": [oc.reward for oc in sessions],
        "session_offsets": offsets,
        "path_weighting": opts.weighting,
    }
    return with_routing(forest, p, with_pack_tag(row, opts.pack))


def build_samples(
    forest: Forest,
    outcomes: Iterable[Outcome | dict] | str | Path,
    options: SampleOptions | None = None,
    *,
    values: Mapping[str, Any] | Iterable[dict] | None = None,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> SampleBatch:
    """Tree-pack the forest's rolled-out sessions into `claw.sample/v1` dicts.

    ``outcomes``: Outcome records, `claw.outcome/v1` dicts, or a JSONL path. ``options``: a
    :class:`SampleOptions` (``algo`` one of :data:`ALGOS`); keyword ``fields`` replace its fields
    (``build_samples(forest, outcomes, algo="ppo", max_tokens=4096)``; ``path_weighting=`` is
    the ``weighting`` field).

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
    pieces of one), and small groups share a sample. ``"batch"``: the rollouts of every group
    and task of one harness (the outcome's ``harness``) go into one sample, group after group,
    so the harness's system prompt and tools appear once per sample rather than once per group
    (and a group's instruction once per group); advantages are still computed per group
    (``group_by``), only the layout changes. Use it with ``max_tokens``: without, a harness's
    whole batch is one sample.

    The stages: votes (who is excluded, group statistics, rollout advantages), kept sessions
    and their trainable paths, path weights u_{p,v}, the plan, the layout of each sample,
    token advantages (PPO's GAE), rows.

    MoE routing (a forest built from calls with ``routing``): each sample's rows (N, L, K) go
    to the side store ``routing_out`` (a path, referenced as given, or a
    :class:`~claw_tree.routing.RoutingStore`), written before the sample that references it;
    ``routing_out=False`` drops them. Routed calls without ``routing_out`` are an error; a forest
    without routing writes no store and no ``routing`` field.
    """
    batch, rows = stream_samples(
        forest, outcomes, options, values=values, routing_out=routing_out, **fields
    )
    return attrs.evolve(batch, samples=[as_lists(row) for row in rows])


def stream_samples(
    forest: Forest,
    outcomes: Iterable[Outcome | dict] | str | Path,
    options: SampleOptions | None = None,
    *,
    values: Mapping[str, Any] | Iterable[dict] | None = None,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> tuple[SampleBatch, Iterator[dict]]:
    """:func:`build_samples` one sample at a time: the batch without its samples (``samples``
    is empty; count the rows with a :class:`SampleTally` for its summary) and the samples,
    each made when the iterator gets to it, so that a writer holds one row at a time (what
    `claw-tree samples` does). A row's per-token fields are numpy arrays
    (:func:`~claw_tree.records.write_jsonl` writes them as lists). Options are checked, and
    PPO's values matched, before it returns."""
    opts = SampleOptions.resolve(options, fields)
    if opts.algo == "sft":
        raise ClawError("algo 'sft' samples come from build_sft_samples (no advantages)")
    if values is not None and opts.algo != "ppo":
        raise ClawError("values are only used with algo='ppo'")
    votes = _votes({t.name for t in forest.sessions}, outcomes_by_session(outcomes), opts)
    kept, excluded = trainable_sessions(forest, votes.excluded)
    weights = _weights(forest, kept, opts.weighting)
    packed: Iterable[Packed] = lay_out(
        forest, _plan(forest, kept, votes, opts), opts.prefix, merge=opts.pack != "session"
    )
    tokens = None
    if opts.algo == "ppo":
        if values is not None:
            packed = list(packed)  # the values are matched to every sample first
        tokens = _token_advantages(forest, kept, votes, packed, values, opts)
    batch = SampleBatch(
        samples=[],
        excluded=excluded,
        rollouts=len(votes.voters),
        trajectories=weights.n_paths,
        zero_spread_groups=votes.zero_spread,
    )
    rows = (_sample_row(forest, p, votes, weights, tokens, opts) for p in packed)
    return batch, store_routing(rows, forest.routing is not None, routing_out)


def _sampling_arrays(forest: Forest, nodes: np.ndarray) -> dict[str, np.ndarray]:
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
        "temperatures": rows[:, 0],
        "top_ps": rows[:, 1],
        "top_ks": rows[:, 2].astype(np.int64),
    }


def _kept_array(forest: Forest, nodes: np.ndarray) -> dict[str, np.ndarray]:
    """``kept`` per token: the engine's kept-set size of the token less itself, from the
    ``completion_kept`` of the call that generated it (the node sits at position depth in that
    call's prompt + completion), -1 for context and for calls without it; nothing when no call
    of the sample has it (samples of other engines and of untruncated calls stay as they were)."""
    gen = forest.call[nodes]
    calls = [ci for ci in np.unique(gen[gen >= 0]) if forest.calls[ci].completion_kept is not None]
    if not calls:
        return {}
    kept = np.full(len(nodes), -1, dtype=np.int64)
    for ci in calls:
        call = forest.calls[ci]
        assert call.completion_kept is not None
        at = np.flatnonzero(gen == ci)
        kept[at] = call.completion_kept[forest.depth[nodes[at]] - len(call.prompt_ids)]
    return {"kept": kept}


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
