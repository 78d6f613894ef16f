"""Mixture-of-experts routing: capture the experts a forward uses, replay recorded ones (R3).

An MoE layer sends each token to the top-k experts of its router. The engine that sampled a
token and the learner that trains on it may pick different experts for it (bf16 vs fp32,
other kernels, other batch layouts), so the learner's logprob is that of another network.
Rollout routing replay (R3, Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning
Training and Inference Routers") makes the learner's forward use the engine's experts; the
gate weights still come from the learner's live router, so router and experts get gradients:

    p = softmax(router_logits)             # (T, E), float32 as the stock router computes it
    w = p[t, idx_t] / sum_k p[t, idx_t,k]  # (T, K), the renormalisation only with norm_topk_prob

Modules are found by their attributes, not by a fixed path (plain, PEFT- or FSDP-wrapped
models): an MoE block is a module with a ``gate`` (the router: ``top_k``, ``num_experts``,
``norm_topk_prob``, forward(hidden) -> (logits (T, E), weights (T, K), indices (T, K))) and
``experts`` (forward(hidden, indices, weights)), as transformers' Qwen3-MoE has.

Torch only: no other claw package is imported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import torch

__all__ = [
    "RouteState",
    "expert_load",
    "flip_rate",
    "is_moe",
    "load_balancing_loss",
    "moe_routers",
    "route",
]


def _moe_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every MoE block of ``model`` in model order (``modules()`` order, duplicates once)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "experts")
        and isinstance(getattr(m, "gate", None), torch.nn.Module)
        and all(hasattr(m.gate, a) for a in ("top_k", "num_experts", "norm_topk_prob"))
    ]


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router (``mlp.gate``) of every MoE layer in model order; ``[]`` for a dense model."""
    return [block.gate for block in _moe_blocks(model)]


def is_moe(model: torch.nn.Module) -> bool:
    """Whether ``model`` has at least one MoE layer."""
    return bool(_moe_blocks(model))


def _in_backward() -> bool:
    """True while autograd runs a backward pass (a checkpointed forward being recomputed)."""
    return torch._C._current_graph_task_id() != -1


@attrs.define
class RouteState:
    """What a `route` block saw. One forward per block is the rule when replaying (``replay``
    is aligned with one call's ``input_ids``; assign ``state.replay`` anew between calls to
    replay several micro-batches in one block); with capture alone several forwards may run:

    - ``captures``: per forward run inside the block (recomputations in backward excluded),
      in call order, the experts it used, (B, N, L, K) long, on the model's device;
    - ``captured``: the last of them (``None`` before the first forward);
    - ``router_logits``: the last forward's live router logits per MoE layer, (B*N, E), with
      grad (for `load_balancing_loss`).
    """

    replay: torch.Tensor | None = None
    capture: bool = False
    captures: list[torch.Tensor] = attrs.field(factory=list)
    router_logits: list[torch.Tensor] = attrs.field(factory=list)
    _shape: tuple[int, int] | None = None
    _layers: list[torch.Tensor] = attrs.field(factory=list)

    @property
    def captured(self) -> torch.Tensor | None:
        return self.captures[-1] if self.captures else None


def _replay_rows(replay: torch.Tensor, layer: int, rows: int, top_k: int) -> torch.Tensor:
    """Layer ``layer``'s replayed experts as the router sees its tokens: (B*N, K)."""
    if replay.shape[-1] != top_k:
        raise ValueError(f"route: replay has K={replay.shape[-1]}, the router picks {top_k}")
    out = replay[..., layer, :].reshape(-1, top_k)
    if out.shape[0] != rows:
        raise ValueError(
            f"route: replay covers {out.shape[0]} tokens (shape {tuple(replay.shape)}) but "
            f"MoE layer {layer} routes {rows}: replay must be aligned with the input_ids"
        )
    return out


def _replayed(
    router: torch.nn.Module, logits: torch.Tensor, live: torch.Tensor, rows: torch.Tensor
):
    """Indices and gate weights with the replayed experts of ``rows`` (-1 rows: ``live``)."""
    indices = torch.where(rows[:, :1] < 0, live, rows.to(live.device))
    probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)  # (T, E)
    weights = probs.gather(-1, indices)  # (T, K)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), indices


def _check_replay(replay: torch.Tensor, routers: list[torch.nn.Module]) -> torch.Tensor:
    if not routers:
        raise ValueError("route: replay given for a model without MoE layers")
    if replay.dim() != 4 or replay.shape[2] != len(routers):
        raise ValueError(
            f"route: replay must be (B, N, L={len(routers)}, K), got {tuple(replay.shape)}"
        )
    num_experts = int(routers[0].num_experts)
    missing = replay < 0
    partial = missing.any(-1) & ~missing.all(-1)
    if bool(partial.any()):
        raise ValueError("route: a replay row mixes -1 with experts; -1 rows are all -1")
    if bool((replay >= num_experts).any()) or bool((replay < -1).any()):
        raise ValueError(f"route: replay values must be experts in [0, {num_experts}) or -1")
    return replay.long()


@contextmanager
def route(
    model: torch.nn.Module, replay: torch.Tensor | None = None, capture: bool = False
) -> Iterator[RouteState]:
    """Replay ``replay`` (B, N, L, K) long (rows of -1 route live) and/or capture the experts
    used by the forwards of ``model`` run inside the block; see `RouteState`.

    Without replay the outputs are bit-identical to the unpatched model's, and replaying the
    captured routing of a forward reproduces its outputs bit for bit. Under activation
    checkpointing (non-reentrant) the recomputed forward replays the same rows (``state.replay``
    as it is then), so run the backward inside the block: after it, the recompute would route
    live and torch raises a CheckpointError (it saves fewer tensors than the replayed forward).
    The hooks are removed when the block exits.
    """
    blocks = _moe_blocks(model)
    routers = [b.gate for b in blocks]
    state = RouteState(
        replay=None if replay is None else _check_replay(replay, routers), capture=capture
    )
    handles = []
    for layer, (block, router) in enumerate(zip(blocks, routers, strict=True)):
        hook = _block_hook(state, layer)
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
        handles.append(router.register_forward_hook(_router_hook(state, layer, len(routers))))
    try:
        yield state
    finally:
        for handle in handles:
            handle.remove()


def _block_hook(state: RouteState, layer: int):
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if layer == 0 and not _in_backward():
            hidden = args[0] if args else kwargs.get("hidden_states")
            state._shape = None
            if isinstance(hidden, torch.Tensor) and hidden.dim() == 3:
                state._shape = (int(hidden.shape[0]), int(hidden.shape[1]))
            state._layers, state.router_logits = [], []

    return hook


def _router_hook(state: RouteState, layer: int, num_layers: int):
    def hook(router: torch.nn.Module, args: tuple, output: tuple) -> tuple | None:
        logits, weights, indices = output
        changed = state.replay is not None
        if changed:
            rows = _replay_rows(state.replay, layer, logits.shape[0], int(router.top_k))
            weights, indices = _replayed(router, logits, indices, rows)
        if not _in_backward():
            state.router_logits.append(logits)
            if state.capture:
                state._layers.append(indices.detach())
                if layer == num_layers - 1:
                    _close_forward(state, num_layers)
        return (logits, weights, indices) if changed else None

    return hook


def _close_forward(state: RouteState, num_layers: int) -> None:
    if len(state._layers) != num_layers:
        raise RuntimeError(
            f"route: a forward ran {len(state._layers)} of {num_layers} MoE layers in order"
        )
    used = torch.stack(state._layers, dim=1)  # (B*N, L, K)
    batch, tokens = state._shape if state._shape else (1, used.shape[0])
    state.captures.append(used.reshape(batch, tokens, *used.shape[1:]))
    state._layers = []


def load_balancing_loss(
    state: RouteState, mask: torch.Tensor | None, num_experts: int, top_k: int
) -> torch.Tensor:
    """Switch Transformer's auxiliary load-balancing loss (Fedus et al. 2021, eq. 4-6), as
    Qwen-MoE uses it, averaged over the MoE layers l of the block's last forward:

        aux = mean_l  E * sum_e f_{l,e} * P_{l,e}

    f_{l,e}: fraction of the (real token, slot) assignments of layer l that went to expert e,
    counted on the experts actually *used* (replayed or live, ``state.captured``; needs
    ``capture=True``); P_{l,e}: mean over real tokens of softmax(router logits)_e, float32.
    Deviations from transformers' ``load_balancing_loss_func``: f sums to 1 over experts
    (there it sums to K, so this is 1/K of it; 1 at perfect balance here), f counts the used
    experts (there the live top-k), and ``mask`` (B, N) bool drops padding per layer.
    ``top_k`` must match the captured K.
    """
    if state.captured is None or not state.router_logits:
        raise ValueError("load_balancing_loss: run one forward inside route(..., capture=True)")
    used = state.captured  # (B, N, L, K)
    if used.shape[-1] != top_k:
        raise ValueError(f"load_balancing_loss: top_k={top_k}, the forward used {used.shape[-1]}")
    used = used.reshape(-1, *used.shape[-2:])  # (T, L, K)
    real = (
        torch.ones(used.shape[0], dtype=torch.bool, device=used.device)
        if mask is None
        else mask.reshape(-1).to(used.device, torch.bool)
    )
    losses = []
    for layer, logits in enumerate(state.router_logits):
        counts = torch.bincount(used[real, layer].reshape(-1), minlength=num_experts)  # (E,)
        f = counts.to(torch.float32) / max(int(real.sum()) * top_k, 1)
        probs = torch.softmax(logits.float(), dim=-1)[real.to(logits.device)]  # (T_real, E)
        P = probs.mean(0) if probs.shape[0] else probs.sum(0)
        losses.append(num_experts * (f.to(P.device) * P).sum())
    return torch.stack(losses).mean()


def flip_rate(live: torch.Tensor, recorded: torch.Tensor) -> tuple[int, int]:
    """(flipped, compared) over the (token, layer) rows of ``recorded`` (..., L, K) that are not
    -1: a row flips when its set of K experts differs from ``live``'s (order does not matter)."""
    if live.shape != recorded.shape:
        raise ValueError(f"flip_rate: shapes {tuple(live.shape)} != {tuple(recorded.shape)}")
    seen = recorded[..., 0] >= 0  # (..., L)
    a = live.sort(dim=-1).values
    b = recorded.to(live.device).sort(dim=-1).values
    flipped = (a != b).any(dim=-1) & seen.to(live.device)
    return int(flipped.sum()), int(seen.sum())


def expert_load(
    indices: torch.Tensor, num_experts: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(L, E) long: how often each expert of each MoE layer was used by the real tokens
    (``mask`` (B, N) bool, ``None`` = all) of ``indices`` (B, N, L, K); -1 values are skipped."""
    if bool((indices >= num_experts).any()):
        raise ValueError(f"expert_load: an expert index is >= num_experts={num_experts}")
    flat = indices.reshape(-1, *indices.shape[-2:])  # (T, L, K)
    if mask is not None:
        flat = flat[mask.reshape(-1).to(flat.device, torch.bool)]
    out = torch.zeros(flat.shape[1], num_experts, dtype=torch.long, device=flat.device)
    for layer in range(flat.shape[1]):
        values = flat[:, layer].reshape(-1)
        out[layer] = torch.bincount(values[values >= 0], minlength=num_experts)
    return out
