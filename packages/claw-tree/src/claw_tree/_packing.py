"""The stages RL and SFT samples share: outcomes by session, the sessions and paths that carry
trainable tokens, the plan (which pieces of which sessions go into which sample) and the layout
of each planned sample over the forest's nodes (parents, path segments, merged context prefixes).

Every stage returns frozen records; :mod:`claw_tree.samples` and :mod:`claw_tree.sft` put
advantages and loss weights on top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from claw_tree.errors import BudgetError, ConflictError
from claw_tree.records import SAMPLE_SCHEMA, Outcome, read_outcomes
from claw_tree.routing import RoutedRows
from claw_tree.tree import Forest, SessionTree, Trajectory

Piece = tuple[SessionTree, np.ndarray, list[Trajectory]]  # (session tree, its node ids, its paths)


@attrs.frozen(kw_only=True, eq=False)
class Kept:
    """A session that goes into the samples: its paths that hold at least one trainable token,
    and how many trainable tokens each of them holds."""

    tree: SessionTree
    paths: list[Trajectory]
    counts: list[int]


@attrs.frozen(kw_only=True, eq=False)
class Packed:
    """One planned sample laid out over the forest (n tokens before merging).

    ``nodes`` (n,) are forest node ids, the plan's pieces one after the other; ``parent`` (n,)
    the parent index within the sample (-1 at a root); ``offsets`` the first index of each piece;
    ``seg_loc`` / ``seg_len`` / ``seg_traj`` every segment of the plan's paths: its first index,
    its length and its trajectory. With merged context prefixes (``pack="group"``), ``keep`` (n,)
    marks the tokens that stay and ``merged_parent`` is the parent array over them; ``rep`` (n,)
    the index of the token each one is merged into (itself when it stays).
    """

    sample_id: str
    plan: list[Piece]
    nodes: np.ndarray
    parent: np.ndarray
    offsets: np.ndarray
    seg_loc: np.ndarray
    seg_len: np.ndarray
    seg_traj: np.ndarray
    keep: np.ndarray | None
    merged_parent: np.ndarray | None
    rep: np.ndarray | None = None

    @property
    def trees(self) -> list[SessionTree]:
        """The session of each piece."""
        return [tree for tree, _, _ in self.plan]

    @property
    def n_paths(self) -> int:
        return sum(len(paths) for _, _, paths in self.plan)

    @property
    def piece_index(self) -> np.ndarray:
        """Index into :attr:`plan` of every token (shape (n,))."""
        return np.concatenate([np.full(len(nd), k) for k, (_, nd, _) in enumerate(self.plan)])

    @property
    def final_nodes(self) -> np.ndarray:
        """The forest node ids of the sample's tokens after merging."""
        return self.nodes if self.keep is None else self.nodes[self.keep]

    def path_sums(self, per_segment: list[float] | np.ndarray) -> np.ndarray:
        """Per token (shape (n,)): the sum of ``per_segment`` over the segments through it."""
        diff = np.zeros(len(self.nodes) + 1)
        np.add.at(diff, self.seg_loc, per_segment)
        np.add.at(diff, self.seg_loc + self.seg_len, np.negative(per_segment))
        return np.cumsum(diff)[: len(self.nodes)]

    def merged(self, *arrays: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
        """``(parent, arrays, session_offsets)`` of the final sample: the arrays (shape (n,))
        without the merged tokens."""
        if self.keep is None:
            return self.parent, list(arrays), self.offsets.tolist()
        assert self.merged_parent is not None
        offsets = np.concatenate(([0], np.cumsum(self.keep)))[self.offsets]
        return self.merged_parent, [a[self.keep] for a in arrays], offsets.tolist()


def outcomes_by_session(outcomes: Iterable[Outcome | dict] | str | Path) -> dict[str, Outcome]:
    """Outcome records (or dicts, or a JSONL path) by session; two different ones for one
    session are a :class:`ConflictError`."""
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


def trainable_sessions(
    forest: Forest, excluded: dict[str, str]
) -> tuple[list[Kept], dict[str, str]]:
    """The sessions not excluded that hold trainable tokens, in forest order, and ``excluded``
    with the others added (``"no trainable tokens"``)."""
    excluded = dict(excluded)
    cs = np.concatenate(([0], np.cumsum(forest.trainable)))
    kept: list[Kept] = []
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
        kept.append(Kept(tree=tree, paths=paths, counts=counts))
    return kept, excluded


def paths_through(forest: Forest, kept: list[Kept]) -> np.ndarray:
    """c_v: how many kept paths pass through each node of the forest (shape (N,))."""
    diff = np.zeros(forest.n_nodes + 1)
    for k in kept:
        for path in k.paths:
            for a, b in path.segments:
                diff[a] += 1.0
                diff[b] -= 1.0
    return np.cumsum(diff)[:-1]


def split_session(
    forest: Forest, tree: SessionTree, paths: list[Trajectory], max_tokens: int
) -> list[tuple[np.ndarray, list[Trajectory]]]:
    """Cut one session's paths into pieces of at most max_tokens unique nodes, whole paths only
    (a path longer than that is a :class:`BudgetError` naming its index in the session)."""
    start, stop = tree.start, tree.stop
    mask = np.zeros(stop - start, dtype=bool)
    pieces: list[tuple[np.ndarray, list[Trajectory]]] = []
    current: list[Trajectory] = []
    count = 0
    for path in paths:
        local = path.nodes() - start
        if len(local) > max_tokens:
            raise BudgetError(
                f"session {path.session!r}: its trajectory {path.index - tree.trajectories[0]} "
                f"has {len(local)} tokens, more "
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


def pieces(forest: Forest, k: Kept, max_tokens: int | None) -> list[Piece]:
    """The session whole, or (larger than max_tokens) cut into pieces of whole paths."""
    tree = k.tree
    if max_tokens is None or tree.n_nodes <= max_tokens:
        return [(tree, np.arange(tree.start, tree.stop), k.paths)]
    return [(tree, nodes, sub) for nodes, sub in split_session(forest, tree, k.paths, max_tokens)]


def plan_sessions(forest: Forest, kept: list[Kept], max_tokens: int | None) -> list[list[Piece]]:
    """One sample per session, or sessions packed greedily into samples of <= max_tokens (a
    larger session is split into samples of its own)."""
    plans: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for k in kept:
        if max_tokens is None:
            plans.append(pieces(forest, k, None))
            continue
        if k.tree.n_nodes > max_tokens:
            plans.extend([piece] for piece in pieces(forest, k, max_tokens))
            continue
        if current and size + k.tree.n_nodes > max_tokens:
            plans.append(current)
            current, size = [], 0
        current.extend(pieces(forest, k, max_tokens))
        size += k.tree.n_nodes
    if current:
        plans.append(current)
    return plans


def plan_groups(
    forest: Forest, kept: list[Kept], key: Callable[[SessionTree], str], max_tokens: int | None
) -> list[list[Piece]]:
    """The sessions of each group (``key``) together, groups in order of their first session;
    with max_tokens, consecutive pieces fill a sample while its merged size stays in budget."""
    groups: dict[str, list[Kept]] = {}
    for k in kept:
        groups.setdefault(key(k.tree), []).append(k)
    if max_tokens is None:
        return [
            [piece for k in members for piece in pieces(forest, k, None)]
            for members in groups.values()
        ]
    planned = (
        piece
        for members in groups.values()
        for k in members
        for piece in pieces(forest, k, max_tokens)
    )
    return fill_merged(forest, planned, max_tokens)


def fill_merged(forest: Forest, planned: Iterable[Piece], max_tokens: int) -> list[list[Piece]]:
    """Consecutive pieces fill a sample while its size after merging the shared context
    prefixes stays within max_tokens (a piece that alone exceeds it gets its own sample)."""
    plans: list[list[Piece]] = []
    current: list[Piece] = []
    trie = _ContextTrie(forest)
    size = 0
    for piece in planned:
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


def lay_out(
    forest: Forest, plans: list[list[Piece]], prefix: str, *, merge: bool, first: int = 0
) -> Iterator[Packed]:
    """Each plan as a :class:`Packed` sample ``f"{prefix}-{k}"`` (k from ``first``), one at a
    time (a sample's layout is as large as the sample); ``merge``: with its context prefixes
    merged (:func:`merge_context_prefixes`)."""
    where = np.full(forest.n_nodes, -1, dtype=np.int64)  # node id -> index in the current sample
    for k, plan in enumerate(plans, start=first):
        nodes = np.concatenate([nd for _, nd, _ in plan])
        where[nodes] = np.arange(len(nodes))
        gp = forest.parent[nodes]
        parent = np.where(gp >= 0, where[gp], -1)
        segments = [
            (a, b, path.index) for _, _, paths in plan for path in paths for a, b in path.segments
        ]
        starts = np.array([a for a, _, _ in segments], dtype=np.int64)
        seg_loc = where[starts]
        where[nodes] = -1
        keep = merged_parent = rep = None
        if merge:
            rep = _context_rep(parent, forest.trainable[nodes], forest.tokens[nodes])
            keep, merged_parent = _merged(parent, rep)
        yield Packed(
            sample_id=f"{prefix}-{k}",
            plan=plan,
            nodes=nodes,
            parent=parent,
            offsets=np.concatenate(([0], np.cumsum([len(nd) for _, nd, _ in plan])[:-1])),
            seg_loc=seg_loc,
            seg_len=np.array([b - a for a, b, _ in segments], dtype=np.int64),
            seg_traj=np.array([t for _, _, t in segments], dtype=np.int64),
            keep=keep,
            merged_parent=merged_parent,
            rep=rep,
        )


def sample_head(
    forest: Forest, sample_id: str, algo: str, nodes: np.ndarray, parent: np.ndarray
) -> dict[str, Any]:
    """The fields every sample begins with (schema, id, algo, then the per-token fields), in the
    order of `claw.sample/v1`. Per-token fields are numpy arrays until :func:`as_lists` (a row
    written as made never holds them as lists of Python numbers: 4-5x the memory)."""
    return {
        "schema": SAMPLE_SCHEMA,
        "sample_id": sample_id,
        "algo": algo,
        "input_ids": forest.tokens[nodes],
        "position_ids": forest.depth[nodes],
        "parent": parent,
        "trainable": forest.trainable[nodes].astype(np.int64),
        "logprobs": forest.logprobs[nodes],
    }


def sample_routing(forest: Forest, p: Packed) -> tuple[RoutedRows, int] | None:
    """The routing rows of a laid-out sample in its final token order and its ``routing_forks``
    (None when the forest has no routing). A merged context token keeps the row of the first
    rollout that holds it (or, when that one has none, of the first that has one); every other
    rollout's different row counts as a fork, as do the forest's forks on the nodes the sample
    keeps (the disagreements about the rows it carries)."""
    if forest.routing is None or forest.routing_forks is None:
        return None
    rows = forest.routing[p.nodes]  # (n, L, K), a copy
    forks = int(forest.routing_forks[p.final_nodes].sum())
    if p.keep is not None and p.rep is not None:
        dropped = np.flatnonzero(~p.keep)
        rep = p.rep[dropped]
        known = rows[dropped, 0, 0] >= 0
        known_rep = rows[rep, 0, 0] >= 0
        differ = np.any(rows[dropped] != rows[rep], axis=(1, 2))
        forks += int((differ & known & known_rep).sum())
        fill = known & ~known_rep
        for d, r in zip(dropped[fill].tolist(), rep[fill].tolist(), strict=True):
            if rows[r, 0, 0] < 0:
                rows[r] = rows[d]
        rows = rows[p.keep]
    return RoutedRows(rows=rows, experts=forest.routing_experts), forks


def with_routing(forest: Forest, p: Packed, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``routing`` (its :class:`RoutedRows`, stored later) and
    ``tags.routing_forks`` when the forest has routing; unchanged otherwise."""
    routed = sample_routing(forest, p)
    if routed is not None:
        row["routing"] = routed[0]
        row["tags"]["routing_forks"] = routed[1]
    return row


def as_lists(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its numpy per-token fields as lists (the sample dicts of the library)."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in row.items()}


def with_pack_tag(row: dict[str, Any], pack: str) -> dict[str, Any]:
    """`row` with ``tags.pack`` set when its sessions were packed together (not per session)."""
    if pack != "session":
        row["tags"]["pack"] = pack
    return row


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
    return _merged(parent, _context_rep(parent, trainable, tokens))


def _context_rep(parent: np.ndarray, trainable: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Per token (shape (n,)): the index of the context-prefix token it merges into (the first
    with its token id and merged parent), or itself."""
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
    return np.asarray(rep, dtype=np.int64)


def _merged(parent: np.ndarray, rep_a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, parent over the kept tokens)`` for the merge map ``rep_a``."""
    keep = rep_a == np.arange(len(parent))
    new_index = np.cumsum(keep) - 1
    merged_parent = np.where(parent >= 0, new_index[rep_a[parent]], -1)
    return keep, merged_parent[keep]
