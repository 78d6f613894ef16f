"""One forward pass over tree-packed samples: per-token logprobs, entropies and values.

The backbone (``model.base_model``) runs once over the padded batch with each sample's tree
mask and depth positions; the LM head is applied only to the rows that predict a trainable
token (``parent[i]``), in chunks, so a large vocabulary never materialises (B, N, V) logits.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from claw_rl.packing import Batch

_CHUNK = 2048  # rows of the LM head evaluated at once


def _last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def backbone_hidden(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Last hidden states (B, N, H) of ``model``'s backbone under the tree mask."""
    from torch.distributed.fsdp import FSDPModule

    base = getattr(model, "base_model", model)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.mask,
              "position_ids": batch.position_ids, "use_cache": False}  # fmt: skip
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

    logprobs: torch.Tensor  # (M,) log pi(token | prefix)
    entropy: torch.Tensor  # (M,) entropy of the predicting distribution (no grad)


def token_logprobs(model: torch.nn.Module, hidden: torch.Tensor, batch: Batch, *,
                   temperature: float = 1.0, with_entropy: bool = True) -> TokenStats:
    """Logprob of every trainable token i, read from the hidden state of ``parent[i]``."""
    b, i, p = batch.predictor_index()
    head = model.get_output_embeddings()
    h = hidden[b, p]  # (M, H)
    targets = batch.input_ids[b, i]  # (M,)
    lps, ents = [], []
    for lo in range(0, h.shape[0], _CHUNK):
        logits = head(h[lo : lo + _CHUNK]).float() / temperature  # (m, V)
        logp = F.log_softmax(logits, dim=-1)
        lps.append(logp.gather(-1, targets[lo : lo + _CHUNK, None]).squeeze(-1))
        if with_entropy:
            with torch.no_grad():
                ents.append(-(logp.exp() * logp).sum(-1))
    empty = hidden.new_zeros(0)
    lp = torch.cat(lps) if lps else empty
    ent = torch.cat(ents) if ents else empty.detach()
    return TokenStats(logprobs=lp, entropy=ent)


def scatter_tokens(values: torch.Tensor, batch: Batch, fill: float = 0.0) -> torch.Tensor:
    """Put per-trainable-token values (M,) back into a (B, N) tensor."""
    b, i, _ = batch.predictor_index()
    out = values.new_full(batch.trainable.shape, fill)
    out[b, i] = values
    return out


def values_per_token(value_head: torch.nn.Module, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """V(s_i) for every token: the value head on the hidden state of ``parent[i]`` (B, N).

    ``s_i`` is the prefix before token i, the state in which token i was chosen (the same row
    that predicts its logprob). Roots have no prefix and get 0.
    """
    v_all = value_head(hidden).squeeze(-1).float()  # (B, N): value after each token
    parent = batch.parent.clamp(min=0)
    v = v_all.gather(1, parent)
    return torch.where(batch.parent >= 0, v, torch.zeros_like(v))
