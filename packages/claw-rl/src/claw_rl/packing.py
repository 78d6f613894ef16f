"""Tree packing: a sample's parent array -> attention mask, positions and targets as tensors.

Token i attends to token j iff j == i or j is an ancestor of i, at position ``depth(i)``; then
one forward pass over a sample gives every root-to-leaf path exactly the logits it would get
alone (tests/test_packing.py proves it against one forward per path). The logprob of token i
is read from the hidden state of ``parent[i]``, not of ``i - 1``.

Several samples form a padded batch (B, N): each sample keeps its own tree mask, padding
tokens attend only to themselves and carry no loss.

Two layouts of that mask, chosen by :func:`pack` (``attention="auto"``):

- ``dense``: a (B, 1, N, N) boolean mask for SDPA. Memory and time quadratic in N; used only
  for small batches (N <= :data:`DENSE_MAX_TOKENS`), where it is the faster of the two.
- ``tree``: no N x N tensor at all. Each sample's tokens are also numbered in depth-first
  preorder (``tree_order``); in that order every token's subtree is one interval
  ``[k, tree_end[k])``, so token q attends to token k iff ``k <= q < tree_end[k]`` (k is q or
  an ancestor of q). claw_rl.forward runs the backbone in that order with block-sparse tree
  attention: memory linear in the tree's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from claw_rl.errors import RecordError
from claw_rl.records import Sample

# Largest padded length N packed with a dense mask under attention="auto". Measured on CPU (the
# tiny model, bench/rl_tree_shapes.py session trees, forward + backward, 1 thread): dense / tree
# time 1.07x at 512 tokens (equal within noise), 1.15x at 1024, 1.7x at 2048, 3.1x at 8192; the
# dense mask's N^2 memory dominates from ~16K on (bench/test_rl_tree_attention.py). Not measured
# on CUDA, where flex_attention skips whole masked tiles and so gains earlier still.
DENSE_MAX_TOKENS = 512
ATTENTION_LAYOUTS = ("auto", "dense", "tree")


def ancestor_matrix(parent: Sequence[int]) -> np.ndarray:
    """A[i, j] = True iff j == i or j is an ancestor of i. Shape (N, N), lower-triangular."""
    n = len(parent)
    A = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parent):
        if p >= 0:
            A[i, : p + 1] = A[p, : p + 1]
        A[i, i] = True
    return A


def is_chain(parent: Sequence[int]) -> bool:
    """True when the sample is one path (parent = [-1, 0, 1, ...]): the ordinary causal mask."""
    return all(p == i - 1 for i, p in enumerate(parent))


def preorder(parent: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Depth-first preorder of a forest (roots and children in index order).

    Returns ``order`` (N,): the token at preorder position k is ``order[k]``; and ``end`` (N,):
    the subtree of the token at position k occupies positions ``[k, end[k])``. Then token q
    attends to token k (k is q or an ancestor of q) iff ``k <= q < end[k]``, in preorder
    positions. O(N).
    """
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i, p in enumerate(parent):
        (children[p] if p >= 0 else roots).append(i)
    order = np.empty(n, dtype=np.int64)
    size = np.ones(n, dtype=np.int64)
    stack = roots[::-1]
    k = 0
    while stack:
        i = stack.pop()
        order[k] = i
        k += 1
        stack.extend(children[i][::-1])
    for i in range(n - 1, -1, -1):  # parents precede children in index order (topological)
        if parent[i] >= 0:
            size[parent[i]] += size[i]
    return order, np.arange(n, dtype=np.int64) + size[order]


def leaf_counts(parent: Sequence[int]) -> np.ndarray:
    """Number of root-to-leaf paths through each token (1 on a chain). Shape (N,)."""
    n = len(parent)
    has_child = np.zeros(n, dtype=bool)
    for p in parent:
        if p >= 0:
            has_child[p] = True
    c = (~has_child).astype(np.float64)
    for i in range(n - 1, -1, -1):
        if parent[i] >= 0:
            c[parent[i]] += c[i]
    return c


def _trajectory_leaves(parent: Sequence[int], trainable: Sequence[int]) -> np.ndarray:
    """(N,) bool: the leaves whose path holds a trainable token."""
    n = len(parent)
    below = np.asarray(trainable, dtype=bool).copy()  # a trainable token on the way from a root
    has_child = np.zeros(n, dtype=bool)
    for i, p in enumerate(parent):
        if p >= 0:
            below[i] |= below[p]
            has_child[p] = True
    return below & ~has_child


def trainable_paths(parent: Sequence[int], trainable: Sequence[int]) -> int:
    """Root-to-leaf paths that hold at least one trainable token (the trajectories a loss sees;
    a context-only path, e.g. a passthrough or token-counting call, is none)."""
    return int(_trajectory_leaves(parent, trainable).sum())


def trajectory_tokens(parent: Sequence[int], trainable: Sequence[int]) -> int:
    """Tokens of the trajectories (paths with a trainable token) each as its own sequence: the
    size of the flat batch a tree-packed sample stands for."""
    depth = np.zeros(len(parent), dtype=np.int64)
    for i, p in enumerate(parent):
        depth[i] = depth[p] + 1 if p >= 0 else 1
    return int(depth[_trajectory_leaves(parent, trainable)].sum())


def session_units(sample: Sample) -> int:
    """How many sessions the sample's tokens can be told apart into: ``len(sessions)`` when
    ``tags["session_offsets"]`` (each session's first own token, claw-tree) has one entry per
    session, else 1 (the sample is one unit)."""
    offsets = (sample.tags or {}).get("session_offsets")
    n = len(sample.sessions)
    return n if n > 1 and isinstance(offsets, list) and len(offsets) == n else 1


def session_index(sample: Sample) -> np.ndarray:
    """Index (N,) of every token's session among the sample's :func:`session_units`."""
    n = len(sample)
    if session_units(sample) == 1:
        return np.zeros(n, dtype=np.int64)
    offsets = np.asarray(sample.tags["session_offsets"])
    return np.searchsorted(offsets, np.arange(n), side="right") - 1


# per-session lists claw-tree writes into a sample's tags, aligned with its sessions
_SESSION_TAGS = ("tasks", "harnesses", "session_rewards")


def keep_sessions(sample: Sample, keep: Sequence[bool]) -> Sample:
    """The sample without the sessions where ``keep`` is False (one flag per session).

    A kept token lies on a path to a leaf of a kept session: a dropped session's own tokens go,
    the context prefix it shares with kept sessions (group packing) stays. Per-token fields are
    cut alike, parents re-indexed, ``sessions`` / ``groups`` and claw-tree's per-session tags cut
    and ``session_offsets`` recomputed; loss weights stay as they were (the aggregator divides by
    the mass it is given), so the kept sessions train as they would in samples of their own.
    """
    keep_s = np.asarray(keep, dtype=bool)
    if len(keep_s) != session_units(sample):
        raise ValueError(
            f"sample {sample.sample_id!r}: {len(keep_s)} keep flags for "
            f"{session_units(sample)} sessions told apart by tags.session_offsets"
        )
    if not keep_s.any():
        raise ValueError(f"sample {sample.sample_id!r}: keep_sessions would drop every session")
    if keep_s.all():
        return sample
    parent = np.asarray(sample.parent, dtype=np.int64)
    n = len(parent)
    sess = session_index(sample)
    has_child = np.zeros(n, dtype=bool)
    has_child[parent[parent >= 0]] = True
    tok = ~has_child & keep_s[sess]  # kept leaves, then every ancestor of one
    for i in range(n - 1, -1, -1):
        if tok[i] and parent[i] >= 0:
            tok[parent[i]] = True
    new_index = np.cumsum(tok) - 1
    cut = lambda xs: None if xs is None else tuple(np.asarray(xs)[tok].tolist())  # noqa: E731
    fields: dict[str, Any] = {
        name: cut(getattr(sample, name))
        for name in (
            "input_ids",
            "position_ids",
            "trainable",
            "logprobs",
            "advantages",
            "loss_weights",
            "returns",
            "policy_versions",
            "temperatures",
            "top_ps",
            "top_ks",
            "kept",
        )
    }
    fields["parent"] = tuple(np.where(parent >= 0, new_index[parent], -1)[tok].tolist())
    if sample.routing is not None:
        fields["routing"] = sample.routing.take(tok)
    tags = dict(sample.tags or {})
    kept = np.flatnonzero(keep_s)
    fields["sessions"] = tuple(sample.sessions[k] for k in kept)
    if len(sample.groups) == len(sample.sessions):
        fields["groups"] = tuple(sample.groups[k] for k in kept)
    for key in _SESSION_TAGS:
        if isinstance(tags.get(key), list) and len(tags[key]) == len(sample.sessions):
            tags[key] = [tags[key][k] for k in kept]
    # a kept session starts at its first kept own token; context it shares with a dropped
    # earlier session (group packing) goes to the kept session before it
    first = [int(new_index[np.flatnonzero(tok & (sess == k))[0]]) for k in kept]
    tags["session_offsets"] = [0, *first[1:]]
    fields["tags"] = tags
    if sample.n_paths is not None:
        fields["n_paths"] = trainable_paths(fields["parent"], fields["trainable"])
    return attrs.evolve(sample, **fields)


def path_matrix(parent: Sequence[int]) -> np.ndarray:
    """P[p, i] = True iff token i lies on path p (one row per leaf, leaves in index order)."""
    A = ancestor_matrix(parent)
    has_child = np.zeros(len(parent), dtype=bool)
    for p in parent:
        if p >= 0:
            has_child[p] = True
    return A[~has_child]


@attrs.frozen
class Batch:
    """Padded tensors for B samples of at most N tokens. Per-token fields are (B, N)."""

    input_ids: torch.Tensor  # (B, N) long
    position_ids: torch.Tensor  # (B, N) long
    mask: torch.Tensor | None  # (B, 1, N, N) bool, or None when every sample is a full chain
    parent: torch.Tensor  # (B, N) long, -1 for roots and padding
    trainable: torch.Tensor  # (B, N) bool
    logprobs: torch.Tensor  # (B, N) engine logprobs
    advantages: torch.Tensor  # (B, N)
    loss_weights: torch.Tensor  # (B, N)
    returns: torch.Tensor | None  # (B, N) or None
    policy_versions: torch.Tensor  # (B, N) long, -1 for context / unknown
    leaf_counts: torch.Tensor  # (B, N) paths through each token
    temperatures: (
        torch.Tensor
    )  # (B, N) temperature each token was sampled at (0 = greedy; 1 on padding)
    top_ps: torch.Tensor  # (B, N) top_p each token was sampled with (1 = off)
    top_ks: torch.Tensor  # (B, N) long, top_k each token was sampled with (0 = off)
    lengths: tuple[int, ...]  # real tokens per sample
    samples: tuple[Sample, ...]
    # the "tree" layout (mask is None and the batch is not all chains), else both None:
    tree_order: torch.Tensor | None = None  # (B, N) long: token at preorder position k
    tree_end: torch.Tensor | None = None  # (B, N) long: end of position k's subtree (exclusive)
    # the engine's experts (B, N, L, K) long per token and MoE layer, -1 on padding and on rows
    # not recorded; None when no sample has routing (docs/formats.md, Routing store)
    routing: torch.Tensor | None = None
    # the engine's kept-set size of each token less itself (B, N) long, -1 on padding and where
    # not recorded; None when no sample has ``kept`` (the learner decides every set)
    kept: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return sum(self.lengths)

    def predictor_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, i, parent) index triples of every trainable token: row ``parent`` predicts ``i``."""
        b, i = self.trainable.nonzero(as_tuple=True)
        return b, i, self.parent[b, i]


def _pad(rows: Sequence[Any], n: int, fill, dtype) -> torch.Tensor:
    out = torch.full((len(rows), n), fill, dtype=dtype)
    for k, r in enumerate(rows):
        if len(r):
            out[k, : len(r)] = torch.as_tensor(np.asarray(r), dtype=dtype)
    return out


def pack(
    samples: Sequence[Sample], *, dtype: torch.dtype = torch.float32, attention: str = "auto"
) -> Batch:
    """Pad ``samples`` into one :class:`Batch` with per-sample tree masks.

    ``attention``: ``dense`` (a (B, 1, N, N) mask), ``tree`` (preorder intervals, no N x N
    tensor) or ``auto`` (dense iff N <= :data:`DENSE_MAX_TOKENS`). Batches of chains get
    neither: the causal mask is exact for them.
    """
    if not samples:
        raise ValueError("pack() needs at least one sample")
    if attention not in ATTENTION_LAYOUTS:
        raise ValueError(f"pack(attention={attention!r}): expected one of {ATTENTION_LAYOUTS}")
    lengths = tuple(len(s) for s in samples)
    n = max(lengths)
    chains = all(is_chain(s.parent) for s in samples)  # right padding is harmless under causal
    if attention == "auto":
        attention = "dense" if n <= DENSE_MAX_TOKENS else "tree"
    mask = tree_order = tree_end = None
    if not chains and attention == "tree":
        order = np.tile(np.arange(n, dtype=np.int64), (len(samples), 1))
        end = order + 1  # padding attends to itself only
        for k, s in enumerate(samples):
            order[k, : len(s)], end[k, : len(s)] = preorder(s.parent)
        tree_order, tree_end = torch.from_numpy(order), torch.from_numpy(end)
    elif not chains:
        m = np.zeros((len(samples), 1, n, n), dtype=bool)
        for k, s in enumerate(samples):
            m[k, 0, : len(s), : len(s)] = ancestor_matrix(s.parent)
        idx = np.arange(n)
        for k, s in enumerate(samples):  # padding rows attend to themselves only
            m[k, 0, idx[len(s) :], idx[len(s) :]] = True
        mask = torch.from_numpy(m)
    returns = None
    if all(s.returns is not None for s in samples):
        returns = _pad([s.returns for s in samples], n, 0.0, dtype)
    versions = [
        s.policy_versions if s.policy_versions is not None else [-1] * len(s) for s in samples
    ]
    return Batch(
        input_ids=_pad([s.input_ids for s in samples], n, 0, torch.long),
        position_ids=_pad([s.position_ids for s in samples], n, 0, torch.long),
        mask=mask,
        parent=_pad([s.parent for s in samples], n, -1, torch.long),
        trainable=_pad([s.trainable for s in samples], n, 0, torch.long).bool(),
        logprobs=_pad([s.logprobs for s in samples], n, 0.0, dtype),
        advantages=_pad([s.advantages for s in samples], n, 0.0, dtype),
        loss_weights=_pad([s.loss_weights for s in samples], n, 0.0, dtype),
        returns=returns,
        policy_versions=_pad(versions, n, -1, torch.long),
        leaf_counts=_pad([leaf_counts(s.parent) for s in samples], n, 0.0, dtype),
        temperatures=_pad(
            [s.temperatures or [1.0] * len(s) for s in samples], n, 1.0, torch.float32
        ),
        top_ps=_pad([s.top_ps or [1.0] * len(s) for s in samples], n, 1.0, torch.float32),
        top_ks=_pad([s.top_ks or [0] * len(s) for s in samples], n, 0, torch.long),
        lengths=lengths,
        samples=tuple(samples),
        tree_order=tree_order,
        tree_end=tree_end,
        routing=pack_routing(samples, n),
        kept=(
            _pad([s.kept or [-1] * len(s) for s in samples], n, -1, torch.long)
            if any(s.kept is not None for s in samples)
            else None
        ),
    )


def pack_routing(samples: Sequence[Sample], n: int) -> torch.Tensor | None:
    """The samples' recorded experts padded to (B, n, L, K) long (-1: padding, not recorded), or
    None when none has routing. Every sample's L and K must agree (one model)."""
    refs = [s.routing for s in samples if s.routing is not None]
    if not refs:
        return None
    L, K = refs[0].layers, refs[0].top_k
    out = torch.full((len(samples), n, L, K), -1, dtype=torch.long)
    for k, s in enumerate(samples):
        if s.routing is None:
            continue
        if (s.routing.layers, s.routing.top_k) != (L, K):
            raise RecordError(
                f"{s.routing.where}: field 'routing.shape' = {list(s.routing.shape)}: "
                f"{s.routing.layers} MoE layers x top {s.routing.top_k}, but {refs[0].where} in "
                f"the same batch has {L} x {K}"
            )
        out[k, : len(s)] = torch.from_numpy(s.routing.load().astype(np.int64))
    return out


def chain_sample(
    sample_id: str,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    completion_logprobs: Sequence[float] | None = None,
    **extra,
) -> Sample:
    """A single-path sample: ``prompt_ids`` as context, ``completion_ids`` trainable.

    Used for ``claw.call/v1`` records (``claw-rl logprobs``) and for per-call baselines. Loss
    weights are 1/T on the completion (one trajectory), advantages default to 0.
    """
    if not prompt_ids:
        raise ValueError(f"{sample_id}: a call needs at least one prompt token")
    n_p, n_c = len(prompt_ids), len(completion_ids)
    n = n_p + n_c
    lp = list(completion_logprobs) if completion_logprobs is not None else [0.0] * n_c
    w = 1.0 / n_c if n_c else 0.0
    fields: dict[str, Any] = dict(
        sample_id=sample_id,
        algo="grpo",
        input_ids=tuple(prompt_ids) + tuple(completion_ids),
        position_ids=tuple(range(n)),
        parent=tuple(range(-1, n - 1)),
        trainable=(0,) * n_p + (1,) * n_c,
        logprobs=(0.0,) * n_p + tuple(lp),
        advantages=(0.0,) * n,
        loss_weights=(0.0,) * n_p + (w,) * n_c,
    )
    fields.update(extra)
    return Sample(**fields)


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """The same batch with every tensor on ``device``."""
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in attrs.fields(Batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return attrs.evolve(batch, **moved)
