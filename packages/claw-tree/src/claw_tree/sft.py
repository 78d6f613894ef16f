"""Tree-packed supervised fine-tuning samples (`claw.sample/v1`, ``algo: "sft"``) from calls alone.

Every token a trainable call generated (its completion, minus a root token) is a target of the
negative log-likelihood; context is not. The packing is that of :func:`~claw_tree.samples.build_samples`
(one sample per session, or sessions packed / split into whole root-to-leaf paths under a token
budget), so a prefix shared by several calls or paths is computed once. No outcome is needed;
with outcomes and ``passed_only`` only rollouts that passed are kept (rejection-sampling
fine-tuning, RFT).

Loss weights. With U the distinct trainable tokens of the batch (tree nodes, i.e. distinct
prefixes of one session), P the root-to-leaf paths holding at least one of them, T_p the trainable
tokens of path p and c_v the paths through token v, ``weighting`` chooses

* ``"token"`` (default): w_v = 1 / U. Every token the teacher generated counts once: the loss is
  the token-mean NLL of the flat batch in which every recorded call is its own example (its
  prompt as context, its completion as targets), the usual SFT on request/response pairs; a
  completion repeated by a later call's prompt is context there, not a second target. Why the
  default: a harness re-sends the conversation on every side call, compaction or sub-agent, so
  one trajectory's early turns lie on many paths; weighting per path would train them once per
  branch the harness happened to make, a count that says nothing about the teacher.
* ``"path"``: w_v = c_v / sum_p T_p, weight 1 per path: the token-mean NLL of the flat batch in
  which every trajectory (root-to-leaf path) is its own example and a shared token is a target
  once on every path through it.

Both equal their flat batch exactly: w_v = sum_{p through v} u_{p,v} with u = 1 / (U c_v) or
1 / sum_p T_p, and when a session is split over several samples each copy of a shared node
carries the shares of the paths of its own piece. The weights of one output sum to 1.
SFT samples carry no ``temperatures`` / ``top_ps`` / ``top_ks``: the NLL is that of the policy's
own distribution at temperature 1, whatever settings the teacher sampled with.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from claw_tree.errors import ClawError
from claw_tree.records import SAMPLE_SCHEMA, Outcome
from claw_tree.samples import (
    Piece,
    SampleBatch,
    _fill_merged,
    _outcomes_by_session,
    _pieces,
    _split_session,
    merge_context_prefixes,
)
from claw_tree.tree import Forest, SessionTree, Trajectory

SFT_WEIGHTING = ("token", "path")
SFT_PACKS = ("session", "group")


def _session_tag(forest: Forest, tree: SessionTree, key: str) -> str:
    """A session's task / harness from its first call's tags ("" when none says)."""
    for ci in tree.calls:
        value = forest.calls[ci].tags.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def build_sft_samples(
    forest: Forest,
    *,
    outcomes: Iterable[Outcome | dict] | str | Path | None = None,
    passed_only: bool = False,
    weighting: str = "token",
    max_tokens: int | None = None,
    id_prefix: str = "sft",
    pack: str = "session",
) -> SampleBatch:
    """Tree-pack the forest's sessions into SFT `claw.sample/v1` dicts (``algo: "sft"``).

    ``outcomes`` (records, dicts or a JSONL path) is optional: without it every session with a
    trainable token is kept; with it sessions without an outcome and rollouts that are not
    ``ok`` are left out, and with ``passed_only`` also those that did not pass (RFT). Left-out
    sessions are in :attr:`SampleBatch.excluded` with the reason. ``max_tokens`` packs sessions
    into samples of at most that many tokens, splitting a larger session into whole paths.
    ``advantages`` are 0 and ``logprobs`` the engine's (the teacher's, for diagnostics only).

    ``pack="group"``: SFT has no group statistics, so every kept session is in one group: the
    sessions fill samples of at most ``max_tokens`` tokens *after* merging, and the context
    prefix they share (system prompt, tools: root to first trainable token, leaves excluded)
    appears once per sample (:func:`~claw_tree.samples.merge_context_prefixes`). Only context
    is merged, so the loss weights and paths are those of ``"session"`` packing. Without
    ``max_tokens`` all sessions go into one sample.
    """
    if weighting not in SFT_WEIGHTING:
        raise ClawError(f"weighting must be one of {SFT_WEIGHTING}, got {weighting!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ClawError("max_tokens must be positive")
    if pack not in SFT_PACKS:
        raise ClawError(f"pack must be one of {SFT_PACKS}, got {pack!r}")
    if passed_only and outcomes is None:
        raise ClawError("passed_only needs the outcomes (which rollouts passed)")
    by_session = None if outcomes is None else _outcomes_by_session(outcomes)
    excluded: dict[str, str] = {}
    if by_session is not None:
        in_forest = {t.name for t in forest.sessions}
        for name, oc in sorted(by_session.items()):
            if name not in in_forest:
                excluded[name] = "no calls"
            elif oc.status != "ok":
                excluded[name] = f"status {oc.status}"
            elif passed_only and not oc.passed:
                excluded[name] = "not passed"
        for name in sorted(in_forest - set(by_session)):
            excluded[name] = "no outcome"

    cs = np.concatenate(([0], np.cumsum(forest.trainable)))
    included: list[tuple[SessionTree, list[Trajectory]]] = []
    total_path_tokens = 0
    for tree in forest.sessions:
        if tree.name in excluded:
            continue
        paths = []
        for ti in tree.trajectories:
            path = forest.trajectories[ti]
            n_p = int(sum(cs[b] - cs[a] for a, b in path.segments))
            if n_p > 0:
                paths.append(path)
                total_path_tokens += n_p
        if not paths:
            excluded[tree.name] = "no trainable tokens"
            continue
        included.append((tree, paths))

    # c_v = included paths through each node; w_v = the node's whole weight in the batch
    diff = np.zeros(forest.n_nodes + 1)
    for _, paths in included:
        for path in paths:
            for a, b in path.segments:
                diff[a] += 1.0
                diff[b] -= 1.0
    through = np.cumsum(diff)[:-1]
    n_tokens = sum(int(forest.trainable[t.start : t.stop].sum()) for t, _ in included)
    if weighting == "token":
        w_full = np.full(forest.n_nodes, 1.0 / max(n_tokens, 1))
    else:
        w_full = through / max(total_path_tokens, 1)

    plans = (
        _plan_merged(forest, included, max_tokens)
        if pack == "group"
        else _plan_sessions(forest, included, max_tokens)
    )
    where = np.full(forest.n_nodes, -1, dtype=np.int64)  # node id -> index in the current sample
    samples = []
    for k, plan in enumerate(plans):
        nodes = np.concatenate([nd for _, nd, _ in plan])
        n = len(nodes)
        where[nodes] = np.arange(n)
        gp = forest.parent[nodes]
        parent = np.where(gp >= 0, where[np.maximum(gp, 0)], -1)
        trainable = forest.trainable[nodes]
        # paths of this sample through each of its nodes (a split session's shared ancestors
        # carry only the shares of the paths in this piece)
        here = np.zeros(n + 1)
        for _, _, paths in plan:
            for path in paths:
                for a, b in path.segments:
                    loc = int(where[a])
                    here[loc] += 1.0
                    here[loc + b - a] -= 1.0
        where[nodes] = -1
        share = np.divide(
            np.cumsum(here)[:n], through[nodes], out=np.zeros(n), where=through[nodes] > 0
        )
        weights = np.where(trainable, w_full[nodes] * share, 0.0)
        sessions = [tree for tree, _, _ in plan]
        offsets = np.concatenate(([0], np.cumsum([len(nd) for _, nd, _ in plan])[:-1]))
        if pack == "group":
            keep, parent = merge_context_prefixes(parent, trainable, forest.tokens[nodes])
            offsets = np.concatenate(([0], np.cumsum(keep)))[offsets]
            nodes, trainable, weights = nodes[keep], trainable[keep], weights[keep]
            n = len(nodes)
        row: dict[str, Any] = {
            "schema": SAMPLE_SCHEMA,
            "sample_id": f"{id_prefix}-{k}",
            "algo": "sft",
            "input_ids": forest.tokens[nodes].tolist(),
            "position_ids": forest.depth[nodes].tolist(),
            "parent": parent.tolist(),
            "trainable": trainable.astype(np.int64).tolist(),
            "logprobs": forest.logprobs[nodes].tolist(),
            "advantages": [0.0] * n,
            "loss_weights": weights.tolist(),
            "policy_versions": forest.policy_version[nodes].tolist(),
            "sessions": [t.name for t in sessions],
        }
        if by_session is not None:
            row["groups"] = [by_session[t.name].group for t in sessions]
        row["n_paths"] = sum(len(paths) for _, _, paths in plan)
        row["tags"] = {
            "tasks": [
                by_session[t.name].task if by_session else _session_tag(forest, t, "task")
                for t in sessions
            ],
            "harnesses": [
                by_session[t.name].harness if by_session else _session_tag(forest, t, "harness")
                for t in sessions
            ],
            "session_offsets": offsets.tolist(),
            "sft_weighting": weighting,
        }
        if pack == "group":
            row["tags"]["pack"] = "group"
        samples.append(row)
    return SampleBatch(
        samples=samples,
        excluded=excluded,
        rollouts=len(included),
        trajectories=sum(len(p) for _, p in included),
        zero_spread_groups=[],
    )


def _plan_sessions(
    forest: Forest, included: list[tuple[SessionTree, list[Trajectory]]], max_tokens: int | None
) -> list[list[Piece]]:
    """One sample per session, or sessions packed greedily into samples of <= max_tokens."""
    plans: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for tree, paths in included:
        if max_tokens is None or tree.n_nodes <= max_tokens:
            piece = (tree, np.arange(tree.start, tree.stop), paths)
            if max_tokens is None:
                plans.append([piece])
                continue
            if current and size + tree.n_nodes > max_tokens:
                plans.append(current)
                current, size = [], 0
            current.append(piece)
            size += tree.n_nodes
        else:
            for nodes, sub in _split_session(forest, tree.start, tree.stop, paths, max_tokens):
                plans.append([(tree, nodes, sub)])
    if current:
        plans.append(current)
    return plans


def _plan_merged(
    forest: Forest, included: list[tuple[SessionTree, list[Trajectory]]], max_tokens: int | None
) -> list[list[Piece]]:
    """All sessions as one group: consecutive pieces fill a sample while its size after merging
    the shared context prefixes stays within max_tokens (all in one sample without a budget)."""
    if max_tokens is None:
        return (
            [[p for tree, paths in included for p in _pieces(forest, tree, paths, None)]]
            if included
            else []
        )
    pieces = (
        piece for tree, paths in included for piece in _pieces(forest, tree, paths, max_tokens)
    )
    return _fill_merged(forest, pieces, max_tokens)
