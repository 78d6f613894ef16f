"""Block-sparse tree attention for tokens laid out in depth-first preorder (claw_rl.packing).

In preorder every token's subtree is one interval, so query q may attend to key k iff
``k <= q < end[k]`` (k is q or one of its ancestors); no N x N mask is ever built.

- CUDA: ``flex_attention`` (compiled) with a :class:`TreeMask`, a ``BlockMask`` whose block
  table comes straight from the intervals: O((N/128)^2) small integers, the flex kernels never
  touch a fully masked 128 x 128 tile.
- CPU (flex_attention has no CPU backward): queries in chunks of C; the keys a chunk needs are
  the ancestors of its first token plus the chunk itself (every other ancestor of a token in
  the chunk lies inside the chunk: preorder), gathered and fed to SDPA with a small
  (C, ancestors + C) mask. Backward recomputes each chunk (a custom autograd function), so what
  it keeps is q, k, v themselves: memory linear in N. The work is the tree's own (each query against
  its ancestors), not N^2.

Registered with transformers' AttentionInterface as ``claw_tree`` (SDPA for any other mask);
claw_rl.forward switches a model to it at its first tree forward pass (:func:`enable`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

NAME = "claw_tree"
BLOCK = 128  # flex tile (queries and keys)
_CPU_CHUNK = 512  # queries per CPU chunk: its mask is 512 x (ancestors + 512) booleans
_compiled_flex = None
FLEX_ON_CUDA = True  # False: the chunked kernel on CUDA too (a fallback; bench/gpu_check.py)


class TreeMask(BlockMask):
    """A flex ``BlockMask`` for the tree plus ``end`` (B, N_pad): the CPU kernel reads the
    intervals directly. transformers passes a 4-D BlockMask through to the attention function
    unchanged."""

    end: torch.Tensor


def tree_block_mask(end: torch.Tensor, block: int = BLOCK) -> TreeMask:
    """The block table of ``k <= q < end[b, k]`` for ``end`` (B, N) in preorder positions.

    The keys of one tile [k0, k1) cover the queries [k0, max end) (preorder: consecutive subtree
    intervals touch), so a (query tile, key tile) pair holds some allowed pair iff the tiles'
    ranges meet, and all of its pairs are allowed iff k1 - 1 <= q0 and min end >= q1.
    """
    B, N = end.shape
    nb = max(1, math.ceil(N / block))
    idx = torch.arange(nb * block, device=end.device)
    endp = torch.cat([end, (idx[N:] + 1).expand(B, -1)], dim=1)  # tail: self-attending padding
    tiles = endp.view(B, nb, block)
    max_end, min_end = tiles.max(-1).values, tiles.min(-1).values  # (B, nb) per key tile
    t0 = torch.arange(nb, device=end.device) * block  # first index of each tile
    q0, q1 = t0[None, :, None], (t0 + block)[None, :, None]  # query tiles on dim 1
    k0, klast = t0[None, None, :], (t0 + block - 1)[None, None, :]  # key tiles on dim 2
    touch = (q0 < max_end[:, None, :]) & (q1 - 1 >= k0)  # (B, nq, nk)
    full = (klast <= q0) & (min_end[:, None, :] >= q1)
    partial = touch & ~full

    def table(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num = m.sum(-1).to(torch.int32)[:, None]  # (B, 1, nq)
        ind = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
        return num.contiguous(), ind.contiguous()  # (B, 1, nq, nk): listed tiles first

    def mask_mod(b, h, q, k):
        return (k <= q) & (q < endp[b, k])

    kv_num, kv_ind = table(partial)
    full_num, full_ind = table(full)
    mask = TreeMask.from_kv_blocks(
        kv_num, kv_ind, full_num, full_ind, BLOCK_SIZE=block, mask_mod=mask_mod,
        seq_lengths=(N, N),
    )  # fmt: skip
    mask.end = end
    return mask


def _chunk(end: torch.Tensor, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (K,) of queries [q0, q1) of one sample and the (C, K) mask over them: the ancestors
    of q0 (every ancestor outside the chunk of a token in it is one, by preorder), then the
    chunk itself."""
    anc = torch.nonzero(end[:q0] > q0).flatten()
    keys = torch.cat([anc, torch.arange(q0, q1, device=end.device)])  # (K,)
    pos = torch.arange(q0, q1, device=end.device)[:, None]
    return keys, (keys[None, :] <= pos) & (pos < end[keys][None, :])


class _ChunkedTreeAttention(torch.autograd.Function):
    """Forward chunk by chunk without autograd; backward recomputes each chunk, takes its
    gradient and adds the keys' share into one dk, dv (index_add_): nothing of size N^2, and no
    full-size gradient buffer per chunk. Saves q, k, v and end only."""

    @staticmethod
    def forward(ctx, q, k, v, end, scale, C: int):
        B, _, N, _ = q.shape
        gqa = q.shape[1] != k.shape[1]
        out = torch.empty_like(q)
        for b in range(B):
            for q0 in range(0, N, C):
                q1 = min(N, q0 + C)
                keys, allowed = _chunk(end[b], q0, q1)
                out[b : b + 1, :, q0:q1] = F.scaled_dot_product_attention(
                    q[b : b + 1, :, q0:q1], k[b : b + 1, :, keys], v[b : b + 1, :, keys],
                    attn_mask=allowed, scale=scale, enable_gqa=gqa,
                )  # fmt: skip
        ctx.save_for_backward(q, k, v, end)
        ctx.scale, ctx.C, ctx.gqa = scale, C, gqa
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, end = ctx.saved_tensors
        B, _, N, _ = q.shape
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for b in range(B):
            for q0 in range(0, N, ctx.C):
                q1 = min(N, q0 + ctx.C)
                keys, allowed = _chunk(end[b], q0, q1)
                with torch.enable_grad():
                    qc = q[b : b + 1, :, q0:q1].detach().requires_grad_()
                    kc = k[b : b + 1, :, keys].detach().requires_grad_()
                    vc = v[b : b + 1, :, keys].detach().requires_grad_()
                    o = F.scaled_dot_product_attention(
                        qc, kc, vc, attn_mask=allowed, scale=ctx.scale, enable_gqa=ctx.gqa
                    )
                    gq, gk, gv = torch.autograd.grad(o, (qc, kc, vc), dout[b : b + 1, :, q0:q1])
                dq[b : b + 1, :, q0:q1] = gq
                dk[b].index_add_(1, keys, gk[0])
                dv[b].index_add_(1, keys, gv[0])
        return dq, dk, dv, None, None, None


def chunked_tree_attention(q, k, v, end: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Exact tree attention on any device with memory linear in N. q (B, Hq, N, D), k, v
    (B, Hkv, N, D), end (B, N) -> (B, Hq, N, D)."""
    C = min(_CPU_CHUNK, q.shape[2])
    return _ChunkedTreeAttention.apply(q, k, v, end, scale, C)


def flex_tree_attention(q, k, v, mask: TreeMask, scale: float | None) -> torch.Tensor:
    """The same through compiled flex_attention (CUDA; CPU only without autograd)."""
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    out = _compiled_flex(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0] if isinstance(out, tuple) else out


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers attention function: (B, H, N, D) inputs -> ((B, N, H, D), None). Tree
    attention for a :class:`TreeMask`, transformers' SDPA attention for anything else."""
    if not isinstance(attention_mask, TreeMask):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{NAME} attention does not implement sliding-window layers")
    if dropout:
        raise ValueError(f"{NAME} attention does not implement attention dropout")
    if query.is_cuda and FLEX_ON_CUDA:
        out = flex_tree_attention(query, key, value, attention_mask, scaling)
    else:
        out = chunked_tree_attention(query, key, value, attention_mask.end, scaling)
    return out.transpose(1, 2).contiguous(), None


def enable(model: torch.nn.Module) -> None:
    """Route ``model``'s attention through ``claw_tree`` (idempotent).

    ``claw_tree`` is SDPA (its mask function and attention) for every input but a
    :class:`TreeMask`, so the switch stays: layers recomputed in backward under activation
    checkpointing must see it too. Only models on SDPA (how claw-rl loads them) are switched.
    The implementation name is not saved with the config (transformers keeps it internal).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    for m in model.modules():
        cfg = getattr(m, "config", None)
        impl = getattr(cfg, "_attn_implementation", NAME)
        if impl == NAME:
            continue
        if impl != "sdpa":
            raise ValueError(
                f"tree attention stands in for SDPA, but this model uses {impl!r}: load it "
                "with attn_implementation='sdpa'"
            )
        cfg._attn_implementation = NAME  # type: ignore[union-attr]
