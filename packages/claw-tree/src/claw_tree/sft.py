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

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from claw_tree._packing import (
    Kept,
    Packed,
    as_lists,
    lay_out,
    outcomes_by_session,
    paths_through,
    plan_groups,
    plan_sessions,
    sample_head,
    trainable_sessions,
    with_pack_tag,
    with_routing,
)
from claw_tree.errors import ClawError
from claw_tree.options import SFT_PACKS, SFT_WEIGHTING, SampleOptions
from claw_tree.records import Outcome
from claw_tree.routing import RoutingOut, store_routing
from claw_tree.samples import SampleBatch
from claw_tree.tree import Forest, SessionTree

__all__ = ["SFT_PACKS", "SFT_WEIGHTING", "build_sft_samples", "stream_sft_samples"]


@attrs.frozen(kw_only=True, eq=False)
class _SftWeights:
    """w_v (the node's whole weight in the batch) and c_v (kept paths through it), shape (N,)."""

    whole: np.ndarray
    through: np.ndarray


def _session_tag(forest: Forest, tree: SessionTree, key: str) -> str:
    """A session's task / harness from its first call's tags ("" when none says)."""
    for ci in tree.calls:
        value = forest.calls[ci].tags.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _sft_excluded(
    forest: Forest, by_session: dict[str, Outcome] | None, passed_only: bool
) -> dict[str, str]:
    """Stage 1: the sessions left out by their outcome (none without outcomes)."""
    excluded: dict[str, str] = {}
    if by_session is None:
        return excluded
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
    return excluded


def _sft_weights(forest: Forest, kept: list[Kept], weighting: str) -> _SftWeights:
    """Stage 3: ``"token"``: w_v = 1 / U; ``"path"``: w_v = c_v / sum_p T_p."""
    through = paths_through(forest, kept)
    if weighting == "token":
        n_tokens = sum(int(forest.trainable[k.tree.start : k.tree.stop].sum()) for k in kept)
        whole = np.full(forest.n_nodes, 1.0 / max(n_tokens, 1))
    else:
        whole = through / max(sum(sum(k.counts) for k in kept), 1)
    return _SftWeights(whole=whole, through=through)


def _sft_row(
    forest: Forest,
    p: Packed,
    weights: _SftWeights,
    by_session: dict[str, Outcome] | None,
    opts: SampleOptions,
) -> dict[str, Any]:
    """Stage 4: one `claw.sample/v1` dict (``algo: "sft"``). A split session's shared ancestors
    carry only the shares of the paths in this piece."""
    nodes = p.nodes
    through = weights.through[nodes]
    share = np.divide(
        p.path_sums(np.ones(len(p.seg_loc))), through, out=np.zeros(len(nodes)), where=through > 0
    )
    loss = np.where(forest.trainable[nodes], weights.whole[nodes] * share, 0.0)
    parent, (nodes, loss), offsets = p.merged(nodes, loss)
    trees = p.trees
    row = sample_head(forest, p.sample_id, "sft", nodes, parent)
    row["advantages"] = np.zeros(len(nodes))
    row["loss_weights"] = loss
    row["policy_versions"] = forest.policy_version[nodes]
    row["sessions"] = [t.name for t in trees]
    if by_session is not None:
        row["groups"] = [by_session[t.name].group for t in trees]
    row["n_paths"] = p.n_paths
    row["tags"] = {
        "tasks": [
            by_session[t.name].task if by_session else _session_tag(forest, t, "task")
            for t in trees
        ],
        "harnesses": [
            by_session[t.name].harness if by_session else _session_tag(forest, t, "harness")
            for t in trees
        ],
        "session_offsets": offsets,
        "sft_weighting": opts.weighting,
    }
    return with_routing(forest, p, with_pack_tag(row, opts.pack))


def build_sft_samples(
    forest: Forest,
    *,
    outcomes: Iterable[Outcome | dict] | str | Path | None = None,
    options: SampleOptions | None = None,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> SampleBatch:
    """Tree-pack the forest's sessions into SFT `claw.sample/v1` dicts (``algo: "sft"``).

    ``options``: a :class:`~claw_tree.options.SampleOptions` with ``algo="sft"`` (default:
    ``SampleOptions(algo="sft")``); keyword ``fields`` replace its fields
    (``build_sft_samples(forest, weighting="path", max_tokens=8192)``).

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
    ``max_tokens`` all sessions go into one sample. ``pack="batch"`` is the same as ``"group"``
    (there are no groups to cross), so one flag serves the RL and the SFT samples of a run.
    ``routing_out``: where MoE routing goes, as for :func:`~claw_tree.samples.build_samples`.
    """
    batch, rows = stream_sft_samples(
        forest, outcomes=outcomes, options=options, routing_out=routing_out, **fields
    )
    return attrs.evolve(batch, samples=[as_lists(row) for row in rows])


def stream_sft_samples(
    forest: Forest,
    *,
    outcomes: Iterable[Outcome | dict] | str | Path | None = None,
    options: SampleOptions | None = None,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> tuple[SampleBatch, Iterator[dict]]:
    """:func:`build_sft_samples` one sample at a time: the batch without its samples and the
    samples, each made when the iterator gets to it (see
    :func:`~claw_tree.samples.stream_samples`)."""
    opts = SampleOptions.resolve(options, fields, algo="sft")
    if opts.algo != "sft":
        raise ClawError(f"build_sft_samples needs algo='sft' options, got algo={opts.algo!r}")
    if opts.passed_only and outcomes is None:
        raise ClawError("passed_only needs the outcomes (which rollouts passed)")
    by_session = None if outcomes is None else outcomes_by_session(outcomes)
    kept, excluded = trainable_sessions(forest, _sft_excluded(forest, by_session, opts.passed_only))
    weights = _sft_weights(forest, kept, opts.weighting)
    if opts.pack == "session":
        plans = plan_sessions(forest, kept, opts.max_tokens)
    else:  # group or batch: one group, every kept session
        plans = plan_groups(forest, kept, lambda tree: "", opts.max_tokens)
    packed = lay_out(forest, plans, opts.prefix, merge=opts.pack != "session")
    batch = SampleBatch(
        samples=[],
        excluded=excluded,
        rollouts=len(kept),
        trajectories=sum(len(k.paths) for k in kept),
        zero_spread_groups=[],
    )
    rows = (_sft_row(forest, p, weights, by_session, opts) for p in packed)
    return batch, store_routing(rows, forest.routing is not None, routing_out)
