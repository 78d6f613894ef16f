"""One forward pass over tree-packed samples: per-token logprobs, entropies and values.

The backbone (``model.base_model``) runs once over the padded batch with each sample's tree
mask and depth positions: a dense (B, 1, N, N) mask through SDPA for small batches, or, for
the "tree" layout of claw_rl.packing, the tokens in depth-first preorder through block-sparse
tree attention (claw_rl._tree_attention; memory linear in N), hidden states put back in the
batch's order afterwards; the LM head is applied only to the rows that predict a trainable
token (``parent[i]``), in chunks, so a large vocabulary never materialises (B, N, V) logits.
Each token's logprob is that of the distribution the engine drew it from: its call's
temperature, top_k and top_p (claw.sample/v1 ``temperatures`` / ``top_ps`` / ``top_ks``). The
kept set of a truncated token is decided once, in the first pass of a learner step, as an integer
(its size, ``TokenStats.kept``) and replayed by every later pass of that step; where the engine
recorded the size it sampled with (claw.sample/v1 ``kept``, ``Batch.kept``), the first pass takes
that size instead of deciding one from its own logits. An MoE model's
experts are replayed alike (:func:`moe_hidden`: the recorded or first-pass routing, R3 / R2).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from claw_rl._moe import RouteState
from claw_rl.packing import Batch

_CHUNK = 2048  # rows of the LM head evaluated at once
_SORT_CHUNK = 256  # rows sorted at once to find top_k / top_p kept sets


def _last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def backbone_hidden(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Last hidden states (B, N, H) of ``model``'s backbone under the tree mask."""
    if batch.tree_end is None or batch.tree_order is None:
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.mask,
                  "position_ids": batch.position_ids, "use_cache": False}  # fmt: skip
        return _run_backbone(model, inputs)
    from claw_rl._tree_attention import enable, tree_block_mask

    order = batch.tree_order  # (B, N): preorder position k holds token order[k]
    inputs = {"input_ids": batch.input_ids.gather(1, order),
              "attention_mask": tree_block_mask(batch.tree_end),
              "position_ids": batch.position_ids.gather(1, order), "use_cache": False}  # fmt: skip
    enable(model)
    h = _run_backbone(model, inputs)  # (B, N, H) in preorder
    back = torch.argsort(order, dim=1)  # token i sits at preorder position back[i]
    return h.gather(1, back[:, :, None].expand(-1, -1, h.shape[-1]))


@attrs.frozen
class Routed:
    """What the MoE layers of one forward did. ``used`` and ``live`` are in the batch's token
    order; ``state`` (router logits, captured experts) in the order the model saw the tokens
    (the "tree" layout's preorder, which keeps padding at the end: a (B, N) mask of real tokens
    is the same in both orders)."""

    state: RouteState
    used: torch.Tensor  # (B, N, L, K) long: the experts each token went to (replayed or live)
    live: torch.Tensor | None  # (B, N, L, K) long: the live router's top-k (when asked for)


def _permute(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` (B, N, ...) with x[b, k] = old x[b, index[b, k]]."""
    shape = index.shape + (1,) * (x.dim() - 2)
    return x.gather(1, index.reshape(shape).expand(*index.shape, *x.shape[2:]))


def moe_hidden(
    model: torch.nn.Module, batch: Batch, replay: torch.Tensor | None, *, live: bool = False
) -> tuple[torch.Tensor, Routed]:
    """:func:`backbone_hidden` of an MoE model whose tokens go to the experts of ``replay``
    (B, N, L, K) long, in the batch's token order (rows of -1, or None: the live router's top-k);
    the gate weights come from the live router (claw_rl._moe.route). With ``live``, also the
    live router's own top-k of every token (for flip rates; the same float32 softmax and topk
    as the router's)."""
    from claw_rl._moe import route

    order = batch.tree_order  # the "tree" layout runs the tokens in preorder
    if replay is not None and order is not None:
        replay = _permute(replay, order)
    with route(model, replay=replay, capture=True) as state:
        hidden = backbone_hidden(model, batch)
    assert state.captured is not None  # one forward ran inside the block
    used, seen = state.captured, None
    if live:
        K = used.shape[-1]
        with torch.no_grad():
            top = [torch.topk(F.softmax(z.detach(), dtype=torch.float, dim=-1), K).indices
                   for z in state.router_logits]  # fmt: skip
        seen = torch.stack(top, dim=1).reshape(used.shape)
    if order is not None:
        back = torch.argsort(order, dim=1)
        used = _permute(used, back)
        seen = None if seen is None else _permute(seen, back)
    return hidden, Routed(state=state, used=used, live=seen)


def _run_backbone(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    from torch.distributed.fsdp import FSDPModule

    base = getattr(model, "base_model", model)
    if base is model or not isinstance(model, FSDPModule):
        return _last_hidden(base(**inputs))
    # FSDP gathers the root's shards (embeddings, tied LM head) in the root's forward: run it,
    # with the LM head on one position only, and take the backbone's output on the way
    seen: list[torch.Tensor] = []
    hook = base.register_forward_hook(lambda _m, _a, out: seen.append(_last_hidden(out)))
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        hook.remove()
    return seen[-1]


@attrs.frozen
class TokenStats:
    """Per trainable token, in ``batch.predictor_index()`` order (M tokens)."""

    logprobs: torch.Tensor  # (M,) log pi(token | prefix) under the token's sampling settings
    entropy: torch.Tensor  # (M,) entropy of that (truncated) distribution (no grad)
    greedy: torch.Tensor  # (M,) bool: sampled at temperature 0, logprob taken at temperature 1
    kept: torch.Tensor  # (M,) long: size of each token's kept set less the token (-1: untruncated)


def _dropped(z: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """(m, V) bool: tokens outside the kept set of each row of temperature-scaled logits ``z``.

    The ``top_k`` largest (ties at the k-th kept; 0 or >= V = off), then, of those, the smallest
    set, largest first, whose renormalised probability reaches ``top_p`` (a token is dropped when
    the mass ranked strictly above it is already >= top_p; 1 = off): vLLM's order and rule, the
    one claw-proxy samples with. No gradient.
    """
    m, V = z.shape
    use_k = (top_k > 0) & (top_k < V)  # (m,)
    use_p = top_p < 1.0  # (m,)
    out = torch.zeros_like(z, dtype=torch.bool)
    for lo in range(0, m, _SORT_CHUNK):
        sl = slice(lo, lo + _SORT_CHUNK)
        if not bool((use_k[sl] | use_p[sl]).any()):
            continue
        sv, si = torch.sort(z[sl], dim=-1, descending=True)  # (c, V)
        kth = sv.gather(1, (top_k[sl].clamp(1, V) - 1)[:, None])  # (c, 1) k-th largest
        cut_k = use_k[sl, None]
        drop = (z[sl] < kth) & cut_k
        sp = torch.softmax(
            sv.masked_fill((sv < kth) & cut_k, float("-inf")), dim=-1
        )  # sorted, after top_k
        above = torch.cumsum(sp, dim=-1) - sp  # mass ranked strictly above each token
        drop_sorted = (above >= top_p[sl, None]) & use_p[sl, None]
        out[sl] = drop | torch.zeros_like(drop).scatter_(1, si, drop_sorted)
    return out


def _replayed_drop(z: torch.Tensor, kept: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(m, V) bool: the dropped tokens of a kept set decided in an earlier pass, replayed on ``z``.

    Row r keeps its target and the ``kept[r]`` largest of its other logits (the ``_SORT_CHUNK``
    rows sorted at once; of exactly tied logits, the sort's pick: their values are the same);
    ``kept[r] < 0`` keeps the whole row. The kept mass is a sum of the largest logits, so the
    logprob is continuous in ``z``: a near-tie at the set's edge moves it by float round-off, not
    by a token's probability. No gradient.
    """
    m, V = z.shape
    out = torch.zeros_like(z, dtype=torch.bool)
    rows = torch.arange(m, device=z.device)
    for lo in range(0, m, _SORT_CHUNK):
        sl = slice(lo, lo + _SORT_CHUNK)
        if not bool((kept[sl] >= 0).any()):
            continue
        others = z[sl].clone()
        others[rows[sl] - lo, targets[sl]] = float("-inf")  # the target is kept apart
        _, si = torch.sort(others, dim=-1, descending=True)  # (c, V)
        rank = torch.arange(V, device=z.device)[None, :]
        drop_sorted = (rank >= kept[sl, None]) & (kept[sl, None] >= 0)
        out[sl] = torch.zeros_like(drop_sorted).scatter_(1, si, drop_sorted)
    out[rows, targets] = False
    return out


def _engine_sets(
    z: torch.Tensor,
    drop: torch.Tensor,
    kept: torch.Tensor,
    engine: torch.Tensor,
    truncated: torch.Tensor,
    targets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(drop (m, V), kept (m,)) with the rows the engine recorded (``engine[r] >= 0`` on a
    truncated row) set to the engine's size, replayed as :func:`_replayed_drop` does; the other
    rows keep the sets decided from ``z``. No gradient."""
    use = truncated & (engine >= 0)
    if not bool(use.any()):
        return drop, kept
    sizes = torch.where(use, engine, torch.full_like(engine, -1))
    replayed = _replayed_drop(z, sizes, targets)
    return torch.where(use[:, None], replayed, drop), torch.where(use, engine, kept)


def sampling_log_softmax_kept(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    targets: torch.Tensor,
    kept: torch.Tensor | None = None,
    engine: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sampling_log_softmax` with each row's kept set as an integer: ``(logp (m, V), kept
    (m,) long)``, ``kept[r]`` = how many tokens other than ``targets[r]`` row r keeps (-1: the row
    is not truncated - top_p 1 and top_k off, or greedy).

    ``kept`` None: the sets are decided from these logits (:func:`_dropped`, the targets kept).
    ``kept`` given (from an earlier pass over the same tokens): the sets are not decided again
    but replayed by size (:func:`_replayed_drop`: the target and the ``kept[r]`` largest other
    logits). Without ties this is the set :func:`_dropped` picks (top_k and top_p keep a prefix of
    the logits, largest first); at a near-tie it keeps the size, so passes whose logits differ by
    round-off (another micro-batch padding or packing layout) give logprobs that differ by
    round-off, not by whether a token sits just inside or outside the set.

    ``engine`` (m,) long, with ``kept`` None: the sizes the engine sampled with (-1: not
    recorded). A truncated row with a recorded size takes it (the target and the ``engine[r]``
    largest other logits) instead of deciding one, so the learner's set is the engine's even
    where a near-tie puts the edge elsewhere in the learner's logits; the returned ``kept`` holds
    it for later passes. The other rows are decided as without it.
    """
    greedy = temperature <= 0
    T = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    z = logits / T[:, None]
    m, V = z.shape
    if kept is None:
        top_p = torch.where(greedy, torch.ones_like(top_p), top_p)
        top_k = torch.where(greedy, torch.zeros_like(top_k), top_k)
        truncated = (top_p < 1.0) | ((top_k > 0) & (top_k < V))  # (m,)
        kept = torch.full((m,), -1, dtype=torch.long, device=z.device)
        if not bool(truncated.any()):
            return F.log_softmax(z, dim=-1), kept
        with torch.no_grad():
            drop = _dropped(z.detach(), top_p, top_k)
            rows = torch.arange(m, device=z.device)
            target_in = ~drop[rows, targets]
            kept = torch.where(truncated, (~drop).sum(-1) - target_in.long(), kept)
            drop[rows, targets] = False
            if engine is not None:
                drop, kept = _engine_sets(z.detach(), drop, kept, engine, truncated, targets)
    elif kept.shape != (m,):
        raise ValueError(f"kept counts of shape {tuple(kept.shape)} for {m} rows of logits")
    elif bool((kept >= 0).any()):
        with torch.no_grad():
            drop = _replayed_drop(z.detach(), kept, targets)
    else:
        return F.log_softmax(z, dim=-1), kept
    return F.log_softmax(z.masked_fill(drop, float("-inf")), dim=-1), kept


def sampling_log_softmax(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    targets: torch.Tensor | None = None,
    kept: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities (m, V) of the distribution each row was sampled from, -inf outside it.

    ``log_softmax(logits / T)`` restricted to the kept set of :func:`_dropped` (chosen from these
    logits under no_grad; gradient flows through the kept logits) and renormalised over it.
    ``targets`` (m,), when given, always count as kept, so that a sampled token whose learner
    probability sits just outside the learner's own set (a tie at the top_p boundary, a policy that
    moved since sampling) gets a finite logprob. ``kept`` (m,), with ``targets``: the sets' sizes
    decided in an earlier pass, replayed instead of decided again
    (:func:`sampling_log_softmax_kept`). Rows with T = 0 (greedy: the engine drew from a
    point mass) are taken at T = 1 without truncation; callers leave those tokens out.
    logits: (m, V) float; temperature, top_p: (m,) float; top_k: (m,) long.
    """
    if targets is not None:
        return sampling_log_softmax_kept(logits, temperature, top_p, top_k, targets, kept)[0]
    if kept is not None:
        raise ValueError("sampling_log_softmax: replaying kept counts needs the targets")
    greedy = temperature <= 0
    T = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    z = logits / T[:, None]
    top_p = torch.where(greedy, torch.ones_like(top_p), top_p)
    top_k = torch.where(greedy, torch.zeros_like(top_k), top_k)
    if bool(((top_p < 1.0) | ((top_k > 0) & (top_k < z.shape[-1]))).any()):
        with torch.no_grad():
            drop = _dropped(z.detach(), top_p, top_k)
        z = z.masked_fill(drop, float("-inf"))
    return F.log_softmax(z, dim=-1)


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy (m,) of rows of log-probabilities (m, V) that may hold -inf (truncated tokens).

    The -inf entries are replaced by 0 before the product, not after it: exp(-inf) * -inf is
    NaN, and a NaN in the branch ``torch.where`` leaves out still makes its gradient NaN."""
    finite = torch.isfinite(logp)
    safe = torch.where(finite, logp, torch.zeros_like(logp))
    return -torch.where(finite, safe.exp() * safe, torch.zeros_like(logp)).sum(-1)


def _head_chunk(head, h, T, top_p, top_k, targets, kept, engine, with_entropy: bool):
    """(logprob of ``targets`` (m,), entropy (m,) or None, kept counts (m,)) of one chunk of
    predictor rows; ``kept`` None decides the kept sets (the ``engine``'s sizes where recorded),
    else replays them."""
    logp, kept = sampling_log_softmax_kept(head(h).float(), T, top_p, top_k, targets, kept, engine)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = entropy(logp)
    return logp.gather(-1, targets[:, None]).squeeze(-1), ent, kept


def token_logprobs(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    batch: Batch,
    *,
    with_entropy: bool = True,
    kept: torch.Tensor | None = None,
) -> TokenStats:
    """Logprob of every trainable token i, read from the hidden state of ``parent[i]``, under the
    sampling settings token i was drawn with (``batch.temperatures / top_ps / top_ks``; see
    :func:`sampling_log_softmax`).

    ``kept`` (M,): the kept-set sizes an earlier pass over the same tokens returned
    (``TokenStats.kept``), replayed instead of decided again from this pass's logits, so that
    every pass and layout of one learner step uses the same sets (see
    :func:`sampling_log_softmax_kept`). Without ``kept``, a token whose engine recorded its set's
    size (``batch.kept`` >= 0) gets that size instead of one decided from this pass's logits."""
    b, i, p = batch.predictor_index()
    head = model.get_output_embeddings()
    h = hidden[b, p]  # (M, H)
    targets = batch.input_ids[b, i]  # (M,)
    T, top_p, top_k = batch.temperatures[b, i], batch.top_ps[b, i], batch.top_ks[b, i]  # (M,) each
    if kept is not None and kept.shape != T.shape:
        raise ValueError(f"kept counts of shape {tuple(kept.shape)} for {T.numel()} tokens")
    engine = batch.kept[b, i] if kept is None and batch.kept is not None else None  # (M,)
    lps, ents, keeps = [], [], []
    grad = torch.is_grad_enabled() and h.requires_grad
    for lo in range(0, h.shape[0], _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        k_sl = None if kept is None else kept[sl]
        e_sl = None if engine is None else engine[sl]
        args = (head, h[sl], T[sl], top_p[sl], top_k[sl], targets[sl], k_sl, e_sl, with_entropy)
        # under autograd the (m, V) logits are recomputed in backward instead of kept: memory
        # per trainable token is then H, not V (V = 151K floats for Qwen3)
        lp, ent, kc = (
            checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        )
        lps.append(lp)
        keeps.append(kc)
        if with_entropy:
            ents.append(ent)
    empty = hidden.new_zeros(0)
    lp = torch.cat(lps) if lps else empty
    ent = torch.cat(ents) if ents else empty.detach()
    kc = torch.cat(keeps) if keeps else T.new_zeros(0, dtype=torch.long)
    return TokenStats(logprobs=lp, entropy=ent, greedy=T <= 0, kept=kc)


def scatter_tokens(values: torch.Tensor, batch: Batch, fill: float = 0.0) -> torch.Tensor:
    """Put per-trainable-token values (M,) back into a (B, N) tensor."""
    b, i, _ = batch.predictor_index()
    out = values.new_full(batch.trainable.shape, fill)
    out[b, i] = values
    return out


def values_per_token(
    value_head: torch.nn.Module, hidden: torch.Tensor, batch: Batch
) -> torch.Tensor:
    """V(s_i) for every token: the value head on the hidden state of ``parent[i]`` (B, N).

    ``s_i`` is the prefix before token i, the state in which token i was chosen (the same row
    that predicts its logprob). Roots have no prefix and get 0.
    """
    v_all = value_head(hidden).squeeze(-1).float()  # (B, N): value after each token
    parent = batch.parent.clamp(min=0)
    v = v_all.gather(1, parent)
    return torch.where(batch.parent >= 0, v, torch.zeros_like(v))
