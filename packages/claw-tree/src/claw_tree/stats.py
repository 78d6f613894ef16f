"""Forest statistics for humans and dashboards (plain dicts of numbers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from claw_tree.records import Call
from claw_tree.tree import Forest

BRANCH_REASONS = ("output", "context", "sampled", "root")


def _branch_reasons(forest: Forest, lo: int, hi: int) -> dict[str, int]:
    """Why the branches of nodes [lo, hi) diverged.

    At a node with k > 1 children, k - 1 branches start. They diverged inside earlier model
    output ("output": some child was generated, another is context, e.g. a re-rendered or
    edited assistant turn), inside context ("context": all children are context, e.g.
    compaction or a changed tool result), or are two samples of the same context ("sampled":
    all children generated). A session with r roots has r - 1 "root" branches (calls sharing
    no token, e.g. a side call with its own system prompt).
    """
    parent = forest.parent[lo:hi]
    out = dict.fromkeys(BRANCH_REASONS, 0)
    if hi == lo:
        return out
    roots = int((parent < 0).sum())
    out["root"] = max(roots - 1, 0)
    has_parent = parent >= 0
    child_parent = parent[has_parent] - lo
    kids = np.bincount(child_parent, minlength=hi - lo)
    gen = np.bincount(child_parent, weights=forest.trainable[lo:hi][has_parent], minlength=hi - lo)
    branching = kids > 1
    extra = kids[branching] - 1
    g = gen[branching]
    k = kids[branching]
    out["sampled"] = int(extra[g == k].sum())
    out["context"] = int(extra[g == 0].sum())
    out["output"] = int(extra[(g > 0) & (g < k)].sum())
    return out


def rerender_forks(calls: Sequence[Call]) -> tuple[dict[str, int], int]:
    """Calls whose prompt the proxy rendered afresh although their conversation continued an
    earlier call whose ids it could not reuse (`prefix.fork_reason`), by reason; and how many
    of them diverged from that call (`prefix.fork_of`, when it is among `calls`): its prompt +
    completion ids are not a prefix of theirs, so the tree forked there."""
    by_id = {c.call_id: c for c in calls}
    reasons: dict[str, int] = {}
    diverged = 0
    for c in calls:
        if c.fork_reason is None:
            continue
        reasons[c.fork_reason] = reasons.get(c.fork_reason, 0) + 1
        parent = by_id.get(c.fork_of) if c.fork_of is not None else None
        if parent is not None:
            full = np.concatenate([parent.prompt_ids, parent.completion_ids])
            if len(c.prompt_ids) < len(full) or not np.array_equal(c.prompt_ids[: len(full)], full):
                diverged += 1
    return dict(sorted(reasons.items())), diverged


def session_stats(forest: Forest, name: str) -> dict:
    """Numbers for one session's tree."""
    tree = forest.session(name)
    calls = [forest.calls[i] for i in tree.calls]
    flat = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    reasons = _branch_reasons(forest, tree.start, tree.stop)
    lengths = [forest.trajectories[t].length for t in tree.trajectories]
    return {
        "session": name,
        "calls": len(calls),
        "flat_tokens": flat,
        "tree_tokens": tree.n_nodes,
        "trainable_tokens": int(forest.trainable[tree.start : tree.stop].sum()),
        "trajectories": len(tree.trajectories),
        "branches": sum(reasons.values()),
        "branch_reasons": reasons,
        "rerender_forks": sum(rerender_forks(calls)[0].values()),
        "max_depth": max(lengths, default=0),
        **routing_stats(forest, tree.start, tree.stop),
    }


def routing_stats(forest: Forest, lo: int = 0, hi: int | None = None) -> dict:
    """MoE routing of nodes [lo, hi) (nothing for a forest without routing): ``routed_tokens``
    (nodes with a recorded row), ``routing_forks`` ((node, call) pairs whose recorded row
    differed from the one the node kept) and the ``routing`` shape (layers, top_k, experts)."""
    if forest.routing is None or forest.routing_forks is None:
        return {}
    rows = forest.routing[lo:hi]
    return {
        "routed_tokens": int((rows[:, 0, 0] >= 0).sum()),
        "routing_forks": int(forest.routing_forks[lo:hi].sum()),
        "routing": {
            "layers": rows.shape[1],
            "top_k": rows.shape[2],
            "experts": forest.routing_experts,
        },
    }


def forest_stats(forest: Forest) -> dict:
    """Summary of a forest as one JSON-able dict.

    ``flat_tokens`` sums prompt + completion over the (deduplicated) calls, ``tree_tokens``
    counts unique nodes, ``tree_token_ratio = tree_tokens / flat_tokens`` (the fraction of
    tokens a tree-packed batch computes, lower is better) and ``dedup_factor`` its inverse.
    ``branches`` counts branches started beyond the first path of each session
    (= trajectories - sessions with tokens), split by reason in ``branch_reasons``.
    ``calls_reusing_prefix`` counts calls whose prompt reused earlier token ids
    (prefix.reused_tokens > 0); ``false_forks_avoided`` counts calls whose fresh re-render
    would not have matched (prefix.fresh_render_matches == false): without prefix reuse each
    of them would have forked the tree. ``rerender_forks`` counts, by reason, calls the proxy
    had to render afresh although they continued an earlier call it could no longer reuse
    (prefix.fork_reason: its record was unreadable, the template cannot continue a turn), and
    ``rerender_forks_diverged`` how many of those really forked from that call. A forest with
    MoE routing adds :func:`routing_stats` (``routing_forks``: the (node, call) pairs whose
    recorded routing differed from the row the node kept).
    """
    calls = forest.calls
    flat = int(sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls))
    tree_tokens = forest.n_nodes
    reasons = dict.fromkeys(("output", "context", "sampled", "root"), 0)
    per_session_branches = []
    for tree in forest.sessions:
        r = _branch_reasons(forest, tree.start, tree.stop)
        for k, v in r.items():
            reasons[k] += v
        per_session_branches.append(sum(r.values()))
    lengths = np.array([t.length for t in forest.trajectories], dtype=np.int64)
    versions, counts = np.unique(forest.policy_version[forest.trainable], return_counts=True)
    n_sessions = len(forest.sessions)
    forks, diverged = rerender_forks(calls)
    return {
        "sessions": n_sessions,
        "calls": len(calls),
        "duplicate_calls": forest.duplicates,
        "passthrough_calls": sum(1 for c in calls if not c.trainable),
        "empty_calls": sum(t.empty_calls for t in forest.sessions),
        "flat_tokens": flat,
        "tree_tokens": tree_tokens,
        "tree_token_ratio": tree_tokens / flat if flat else 0.0,
        "dedup_factor": flat / tree_tokens if tree_tokens else 0.0,
        "trainable_tokens": int(forest.trainable.sum()),
        "trajectories": len(forest.trajectories),
        "branches": sum(reasons.values()),
        "branch_reasons": reasons,
        "branches_per_session": {
            "mean": float(np.mean(per_session_branches)) if n_sessions else 0.0,
            "max": int(max(per_session_branches, default=0)),
        },
        "depth": {
            "max": int(lengths.max()) if len(lengths) else 0,
            "mean": float(lengths.mean()) if len(lengths) else 0.0,
        },
        "calls_reusing_prefix": sum(1 for c in calls if (c.reused_tokens or 0) > 0),
        "false_forks_avoided": sum(1 for c in calls if c.fresh_render_matches is False),
        "rerender_forks": forks,
        "rerender_forks_diverged": diverged,
        "policy_versions": {str(int(v)): int(n) for v, n in zip(versions, counts, strict=True)},
        **routing_stats(forest),
    }
