"""Routing capture and replay (R3) on the tiny Qwen3-MoE: bit-exact replay, gradients against a
hand-written reference, padding, activation checkpointing, bf16 flips, the aux loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from claw_rl import TinySpec, init_tiny
from claw_rl._moe import (
    RouteState,
    expert_load,
    flip_rate,
    is_moe,
    load_balancing_loss,
    moe_routers,
    route,
)
from transformers import AutoModelForCausalLM

E, K, L = 8, 2, 2  # the tiny MoE: experts, experts per token, MoE layers


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("models") / "moe", TinySpec(num_experts=E))


@pytest.fixture
def model(tiny_moe):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_moe).eval()


def _ids(model, batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch, tokens), generator=g)


def _capture(model, ids, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad(), route(model, capture=True) as state:
        logits = model(ids, **kwargs).logits
    assert state.captured is not None
    return logits, state.captured


def test_routers_are_found_on_plain_base_and_peft_models(model, tiny):
    """Every MoE layer's router in order, through model.model and a LoRA wrapper; none in a
    dense model."""
    from peft import LoraConfig, get_peft_model

    routers = moe_routers(model)
    assert routers == [layer.mlp.gate for layer in model.model.layers]
    assert moe_routers(model.model) == routers and is_moe(model)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert moe_routers(lora) == routers and moe_routers(lora.base_model) == routers
    dense = AutoModelForCausalLM.from_pretrained(tiny)
    assert moe_routers(dense) == [] and not is_moe(dense)


def test_no_replay_is_bit_identical_and_hooks_are_removed(model):
    """A capture-only block leaves the logits bit-identical; on exit no hook remains."""
    ids = _ids(model, 2, 24)
    with torch.no_grad():
        plain = model(ids).logits
    logits, captured = _capture(model, ids)
    assert torch.equal(plain, logits)
    assert captured.shape == (2, 24, L, K) and captured.dtype == torch.long
    for layer in model.model.layers:
        assert not layer.mlp._forward_pre_hooks and not layer.mlp.gate._forward_hooks


def test_replaying_captured_routing_reproduces_logits_bitwise(model):
    """Replaying a forward's own routing gives its logits bit for bit and captures it back."""
    ids = _ids(model, 3, 40)
    logits, captured = _capture(model, ids)
    with torch.no_grad(), route(model, replay=captured, capture=True) as state:
        again = model(ids).logits
    assert torch.equal(again, logits) and torch.equal(state.captured, captured)


def test_other_routing_changes_logits_and_gradients_reach_router_and_used_experts(model):
    """Replaying experts (3, 5) everywhere changes the logits; the loss's gradient reaches every
    router and both projections of experts 3 and 5, and no other expert."""
    ids = _ids(model, 2, 16)
    logits, captured = _capture(model, ids)
    replay = torch.tensor([3, 5]).expand(2, 16, L, K)
    with route(model, replay=replay, capture=True) as state:
        out = model(ids).logits
        out.logsumexp(-1).mean().backward()
    assert torch.equal(state.captured, replay)
    assert not torch.allclose(out, logits, atol=1e-4)
    for layer in model.model.layers:
        assert layer.mlp.gate.weight.grad.abs().sum() > 0
        experts = layer.mlp.experts
        for grad in (experts.gate_up_proj.grad, experts.down_proj.grad):
            used = grad.flatten(1).abs().sum(1) > 0  # (E,)
            assert used.tolist() == [e in (3, 5) for e in range(E)]


def _reference_block(block, h: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """R3 by hand: softmax of the live router logits at the fixed experts, renormalised,
    times each expert's SwiGLU output. h (T, H), experts (T, K) -> (T, H)."""
    p = torch.softmax(h @ block.gate.weight.T, dim=-1)  # (T, E)
    w = p.gather(-1, experts)
    w = w / w.sum(-1, keepdim=True)  # (T, K)
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for k in range(experts.shape[1]):
            e = int(experts[t, k])
            gate, up = (block.experts.gate_up_proj[e] @ h[t]).chunk(2)
            out[t] += w[t, k] * (block.experts.down_proj[e] @ (F.silu(gate) * up))
    return out


def test_r3_gradients_match_a_hand_written_reference(model):
    """With replay, a block's output and d(loss)/d(router weight, expert weights) equal those of
    the hand-written R3 reference."""
    block = model.model.layers[0].mlp
    g = torch.Generator().manual_seed(1)
    h = torch.randn(12, model.config.hidden_size, generator=g)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(12)])  # (T, K)
    c = torch.randn(12, model.config.hidden_size, generator=g)
    params = [block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj]

    ref = _reference_block(block, h, experts)
    want = torch.autograd.grad((ref * c).sum(), params)
    replay = torch.full((1, 12, L, K), -1)
    replay[0, :, 0] = experts
    with route(model, replay=replay):
        out = block(h[None])[0]
        got = torch.autograd.grad((out * c).sum(), params)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(got, want, strict=True):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_minus_one_rows_route_live(model):
    """-1 rows take the live top-k of that forward's router; an all -1 replay changes nothing."""
    ids = _ids(model, 2, 20)
    logits, captured = _capture(model, ids)
    with torch.no_grad(), route(model, replay=torch.full_like(captured, -1)) as state:
        assert torch.equal(model(ids).logits, logits)
    replay = (captured + 1) % E
    replay[:, 10:] = -1
    with torch.no_grad(), route(model, replay=replay, capture=True) as state:
        model(ids)
    used = state.captured
    assert torch.equal(used[:, :10], replay[:, :10])
    for layer, router_logits in enumerate(state.router_logits):
        live = router_logits.float().topk(K, dim=-1).indices.reshape(2, 20, K)
        assert torch.equal(used[:, 10:, layer], live[:, 10:])
    assert not torch.equal(used[:, 10:], captured[:, 10:])  # later tokens saw replayed ones


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_replays_per_token(model, side):
    """Two sequences padded into one batch, each with its own (shifted) routing, -1 at the pads:
    each real token uses its row and gets the logits it gets alone."""
    seqs = [_ids(model, 1, 9, seed=2)[0], _ids(model, 1, 15, seed=3)[0]]
    width = 15
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    replay = torch.full((2, width, L, K), -1)
    alone = []
    for i, seq in enumerate(seqs):
        _, own = _capture(model, seq[None])
        shifted = (own + 3) % E
        with torch.no_grad(), route(model, replay=shifted):
            alone.append(model(seq[None]).logits[0])
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[i, span], mask[i, span], replay[i, span] = seq, 1, shifted[0]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), route(model, replay=replay, capture=True) as state:
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert torch.equal(state.captured[real], replay[real])
    for i in range(2):
        torch.testing.assert_close(logits[i][real[i]], alone[i], rtol=1e-4, atol=1e-5)


def _grads(model, ids, replay, checkpoint: bool, backward_inside: bool = True):
    model.zero_grad(set_to_none=True)
    model.train()
    if checkpoint:
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    with route(model, replay=replay, capture=True) as state:
        loss = model(ids, use_cache=False).logits.logsumexp(-1).mean()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    assert len(state.captures) == 1  # recomputation does not count as a forward
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_checkpoint_recompute_replays_the_same_experts(model):
    """Under non-reentrant activation checkpointing the recomputed forward replays the rows:
    the gradients equal those without checkpointing. Backward after the block would recompute
    with live routing: torch refuses it (the recompute saves fewer tensors than the replayed
    forward did), so the mistake is loud, not wrong gradients."""
    ids = _ids(model, 2, 16)
    _, captured = _capture(model, ids)
    replay = (captured + 1) % E
    plain = _grads(model, ids, replay, checkpoint=False)
    checkpointed = _grads(model, ids, replay, checkpoint=True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-8)
    with pytest.raises(torch.utils.checkpoint.CheckpointError, match="different number"):
        _grads(model, ids, replay, checkpoint=True, backward_inside=False)


def test_bf16_flips_experts_and_replaying_fp32_routing_removes_them(model, tiny_moe):
    """The same input in bfloat16 and float32 picks different experts for some (token, layer)
    rows (14 of 2048 here, 0.7%); replaying the fp32 routing in the bf16 model flips none."""
    ids = _ids(model, 4, 256)
    _, fp32 = _capture(model, ids)
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_moe, dtype=torch.bfloat16).eval()
    _, live = _capture(bf16, ids)
    flipped, compared = flip_rate(live, fp32)
    assert compared == 4 * 256 * L and flipped > 0, (flipped, compared)
    with torch.no_grad(), route(bf16, replay=fp32, capture=True) as state:
        bf16(ids)
    assert flip_rate(state.captured, fp32) == (0, compared)


def test_several_forwards_in_one_block_are_captured_in_order(model):
    """Two micro-batches in one block: `captures` holds both, `captured` is the last; assigning
    `state.replay` between them replays each."""
    a, b = _ids(model, 1, 8, seed=4), _ids(model, 2, 5, seed=5)
    _, ra = _capture(model, a)
    _, rb = _capture(model, b)
    with torch.no_grad(), route(model, capture=True) as state:
        model(a)
        model(b)
    assert [c.shape for c in state.captures] == [ra.shape, rb.shape]
    assert torch.equal(state.captures[0], ra) and torch.equal(state.captured, rb)
    with torch.no_grad(), route(model, replay=(ra + 1) % E, capture=True) as state:
        model(a)
        state.replay = (rb + 2) % E
        model(b)
    assert torch.equal(state.captures[0], (ra + 1) % E)
    assert torch.equal(state.captures[1], (rb + 2) % E)


def test_bad_replay_is_refused(model):
    """Wrong L, K or token count, out-of-range experts and half -1 rows raise ValueError."""
    ids = _ids(model, 1, 6)
    _, ok = _capture(model, ids)
    with pytest.raises(ValueError, match="L=2"), route(model, replay=ok[:, :, :1]):
        pass
    with pytest.raises(ValueError, match=r"\[0, 8\)"), route(model, replay=ok + E):
        pass
    half = ok.clone()
    half[0, 0, 0, 0] = -1
    with pytest.raises(ValueError, match="mixes -1"), route(model, replay=half):
        pass
    wide = torch.zeros(1, 6, L, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="aligned with"), torch.no_grad(), route(model, replay=ok):
        model(_ids(model, 1, 7))
    with pytest.raises(ValueError, match="K=3"), torch.no_grad(), route(model, replay=wide):
        model(ids)


def test_load_balancing_loss_matches_a_hand_computation(model):
    """E * sum_e f_e P_e averaged over layers, f over the used experts of the real tokens, P the
    mean router probability of the real tokens; 1/K of transformers' value when nothing is
    masked; its gradient reaches the routers."""
    ids = _ids(model, 2, 10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :3] = False
    replay = torch.full((2, 10, L, K), -1)
    replay[1, :4] = torch.tensor([6, 7])
    with route(model, replay=replay, capture=True) as state:
        model(ids)
        loss = load_balancing_loss(state, mask, E, K)
        loss.backward()
    used, real = state.captured.reshape(20, L, K), mask.reshape(20)
    want = 0.0
    for layer, logits in enumerate(state.router_logits):
        tokens = [t for t in range(20) if real[t]]
        f = [sum(int(used[t, layer, k]) == e for t in tokens for k in range(K)) for e in range(E)]
        probs = torch.softmax(logits.detach().double(), -1)
        P = [sum(float(probs[t, e]) for t in tokens) / len(tokens) for e in range(E)]
        want += E * sum(f[e] / (len(tokens) * K) * P[e] for e in range(E)) / L
    assert abs(loss.item() - want) < 1e-6
    assert all(r.weight.grad.abs().sum() > 0 for r in moe_routers(model))


def test_load_balancing_loss_is_transformers_over_k_for_one_layer(model):
    """One MoE layer, live routing, no mask: transformers' load_balancing_loss_func / K."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    with torch.no_grad(), route(model, capture=True) as state:
        model(_ids(model, 1, 30))
    one = RouteState(captures=[state.captured[:, :, :1]], router_logits=state.router_logits[:1])
    ours = load_balancing_loss(one, None, E, K)
    theirs = load_balancing_loss_func(tuple(one.router_logits), E, K)
    torch.testing.assert_close(ours * K, theirs)


def test_flip_rate_compares_sets_and_skips_unrecorded_rows():
    """Order within a row does not matter; -1 rows are not compared."""
    live = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # (N=2, L=2, K=2)
    recorded = torch.tensor([[[1, 0], [2, 4]], [[-1, -1], [7, 6]]])
    assert flip_rate(live, recorded) == (1, 3)
    with pytest.raises(ValueError, match="shapes"):
        flip_rate(live, recorded[:1])


def test_expert_load_counts_used_experts_of_real_tokens():
    """(L, E) counts over the real tokens; -1 values are skipped."""
    indices = torch.tensor([[[[0, 1], [2, 2]], [[0, 3], [-1, -1]], [[5, 5], [5, 5]]]])  # (1,3,2,2)
    mask = torch.tensor([[True, True, False]])
    load = expert_load(indices, 6, mask)
    assert load.tolist() == [[2, 1, 0, 1, 0, 0], [0, 0, 2, 0, 0, 0]]
    assert expert_load(indices, 6)[0, 5] == 2
    with pytest.raises(ValueError, match="num_experts=5"):
        expert_load(indices, 5)


def test_fsdp2_wrapped_model_finds_routers_and_replays(model, tmp_path):
    """Under FSDP2 (one gloo rank, each decoder layer its own unit) the routers are found and a
    replayed forward gives the unwrapped model's replayed logits."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    ids = _ids(model, 1, 12)
    _, captured = _capture(model, ids)
    replay = (captured + 1) % E
    with torch.no_grad(), route(model, replay=replay):
        want = model(ids).logits
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        assert len(moe_routers(model)) == L
        with torch.no_grad(), route(model, replay=replay, capture=True) as state:
            got = model(ids).logits
    finally:
        dist.destroy_process_group()
    assert torch.equal(state.captured, replay)
    torch.testing.assert_close(got, want)
