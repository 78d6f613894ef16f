"""Tree-packed training has exactly the gradient of flat per-path training, for every loss
aggregator x training-inference correction, at the default caps, for GRPO and PPO.

The flat reference turns every root-to-leaf path of every packed sample into its own chain
sample whose tokens carry the path's share u_{p,t} of the packed loss weight (sum_p u_{p,t} =
w_t). Both runs take one learner step; the gradient of its first optimizer update is compared.

Tolerance: the packed forward reproduces the per-path forward up to fp32 summation order
(the tree mask sums attention over the same keys in another order), about 1e-6 relative on the
logprobs; the gradient entries here are O(1e-2..1), so differences from packing itself stay
below 1e-6, and 1e-5 absolute is a 10x margin. A wrong keep fraction or denominator (the bugs
this test was written for) moves the gradient by 1e-3 and more.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig, _tree_attention, packing
from claw_rl.packing import leaf_counts, path_matrix

CORRECTIONS = ["none", "tis", "mis_token", "mis_sequence"]
TOL = 1e-5


def _tree(seed: int, n: int) -> tuple[list[int], list[int]]:
    """One root, mostly chains with branches; every leaf is trainable, the root is not."""
    rng = random.Random(seed)
    parent = [-1]
    for i in range(1, n):
        parent.append(i - 1 if rng.random() < 0.7 else rng.randrange(0, i))
    has_child = set(parent)
    trainable = [0] + [1 if (i not in has_child or rng.random() < 0.6) else 0 for i in range(1, n)]
    return parent, trainable


def _batch(vocab: int, weighting: str, ppo: bool, seed: int = 0) -> list[dict]:
    """Two random tree samples (two rollouts) with claw-tree's loss weights for ``weighting``."""
    rng = np.random.default_rng(seed)
    samples = []
    R = 2
    for k in range(R):
        parent, trainable = _tree(seed * 10 + k, 14 + 3 * k)
        n = len(parent)
        pos = []
        for p in parent:
            pos.append(0 if p < 0 else pos[p] + 1)
        paths = path_matrix(parent)
        tr = np.asarray(trainable, dtype=bool)
        T = (paths & tr).sum(1)
        c = leaf_counts(parent)
        if weighting == "rollout":  # W_p = 1 / (R * paths), spread over the path's tokens
            u = (paths & tr) / (R * len(paths) * T[:, None])
        else:  # "token": each trainable token of the rollout weighs 1 / (R * U), split over its paths
            u = (paths & tr) / (R * tr.sum() * c[None, :])
        row = {
            "schema": "claw.sample/v1",
            "sample_id": f"s{k}",
            "algo": "ppo" if ppo else "grpo",
            "input_ids": rng.integers(3, vocab, n).tolist(),
            "position_ids": pos,
            "parent": parent,
            "trainable": trainable,
            "logprobs": [0.0] * n,
            "advantages": np.where(tr, rng.uniform(-1, 1, n), 0.0).tolist(),
            "loss_weights": u.sum(0).tolist(),
            "tags": {"path_weighting": weighting},
            "_u": u,
        }
        if ppo:
            row["returns"] = np.where(tr, rng.uniform(-1, 1, n), 0.0).tolist()
        samples.append(row)
    return samples


def _engine_logprobs(learner, samples: list[dict], seed: int) -> None:
    """Engine logprobs near the learner's: tiny noise everywhere, +-0.9 on some tokens, so that
    TIS truncates, token MIS masks, and sequence MIS drops some paths and keeps others."""
    rng = np.random.default_rng(seed)
    own = learner.logprobs([{k: v for k, v in s.items() if k != "_u"} for s in samples])
    for s, lp in zip(samples, own, strict=True):
        tr = np.asarray(s["trainable"], dtype=bool)
        noise = rng.normal(0, 1e-3, len(lp))
        bump = np.where(rng.random(len(lp)) < 0.2, rng.choice([-0.9, 0.9], len(lp)), 0.0)
        s["logprobs"] = np.where(tr, np.asarray(lp) - noise - bump, 0.0).tolist()


def _flat(samples: list[dict]) -> list[dict]:
    """Every root-to-leaf path as its own chain sample, with its share of the loss weights."""
    out = []
    for s in samples:
        for p, row in enumerate(path_matrix(s["parent"])):
            idx = np.nonzero(row)[0]
            n = len(idx)
            f = {
                k: [s[k][j] for j in idx]
                for k in ("input_ids", "trainable", "logprobs", "advantages")
            }
            f.update(
                schema="claw.sample/v1",
                sample_id=f"{s['sample_id']}-p{p}",
                algo=s["algo"],
                position_ids=list(range(n)),
                parent=list(range(-1, n - 1)),
                loss_weights=[float(s["_u"][p, j]) for j in idx],
            )
            if "returns" in s:
                f["returns"] = [s["returns"][j] for j in idx]
            out.append(f)
    return out


def _grads(learner, samples: list[dict]) -> tuple[dict, dict]:
    """One step; the gradient of every trained parameter as the optimizer saw it at its first
    update, and the metrics. Only the first: after one Adam update (~lr * sign g) the two runs'
    weights differ by 2 lr wherever an entry of g is ~0 with opposite signs in the two runs, so a
    later update's gradient compares two different models (PPO's default epochs = 2)."""
    seen: dict[str, torch.Tensor] = {}
    orig = learner.optimizer.step
    modules = learner.trained_modules()

    def capture(*a, **kw):
        if seen:
            return orig(*a, **kw)
        for name, m in modules.items():
            for n, p in m.named_parameters():
                if p.grad is not None:
                    seen[f"{name}.{n}"] = p.grad.detach().clone()
        return orig(*a, **kw)

    learner.optimizer.step = capture
    metrics = learner.step([{k: v for k, v in s.items() if k != "_u"} for s in samples])
    return seen, metrics


def _lora_b(learner) -> None:
    """LoRA's B starts at zero, which makes the gradient of A zero: give B (the same) random
    values in every learner, so that both of the adapter's matrices get a gradient."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in learner.policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _learner(cls, cfg, tiny):
    learner = cls(cfg, tiny)
    if cfg.lora_rank:
        _lora_b(learner)
    return learner


def _compare(cls, cfg, tiny, weighting: str, ppo: bool) -> tuple[float, float, dict]:
    a = _learner(cls, cfg, tiny)
    samples = _batch(a.policy.config.vocab_size, weighting, ppo)
    _engine_logprobs(a, samples, seed=1)
    g_tree, m_tree = _grads(a, samples)
    g_flat, m_flat = _grads(_learner(cls, cfg, tiny), _flat(samples))
    assert set(g_tree) == set(g_flat) and g_tree
    worst = max(float((g_tree[n] - g_flat[n]).abs().max()) for n in g_tree)
    scale = max(float(g.abs().max()) for g in g_flat.values())
    assert scale > 1e-3  # the comparison is not between two zero gradients
    assert m_tree["loss"] == pytest.approx(m_flat["loss"], abs=1e-6)
    return worst, scale, m_tree


# token_mean and constant ignore the loss weights: one weighting covers them
GRPO_CASES = [
    (agg, corr, weighting)
    for agg in ("weights", "token_mean", "constant")
    for corr in CORRECTIONS
    for weighting in (("token", "rollout") if agg == "weights" else ("token",))
]


@pytest.mark.parametrize(("agg", "correction", "weighting"), GRPO_CASES)
def test_grpo_packed_gradient_equals_flat(tiny, agg, correction, weighting):
    """GRPO: packed and flat per-path gradients agree to 1e-5 for every aggregator x correction."""
    cfg = GRPOConfig(
        lr=1e-3,
        max_grad_norm=0.0,
        is_correction=correction,
        loss_agg=agg,
        constant_len=8,
        entropy_coef=0.01,
    )
    worst, _, m = _compare(Learner.grpo, cfg, tiny, weighting, ppo=False)
    assert worst <= TOL, f"{agg} x {correction} ({weighting}): max |g_tree - g_flat| = {worst:.3g}"
    if correction != "none":  # the perturbation makes every correction act on some tokens
        assert 0.0 < m["is_weight_mean"] < 1.0 or correction == "tis"


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("weighting", ["token", "rollout"])
@pytest.mark.parametrize("center", [True, False], ids=["centred", "scaled"])
def test_ppo_packed_gradient_equals_flat(tiny, correction, weighting, center):
    """PPO (policy, value head, whitened advantages, centred or scaled only): packed and flat
    gradients agree to 1e-5."""
    cfg = PPOConfig(
        lr=1e-3,
        max_grad_norm=0.0,
        is_correction=correction,
        epochs=1,
        minibatches=1,
        whiten_center=center,
    )
    worst, _, _ = _compare(Learner.ppo, cfg, tiny, weighting, ppo=True)
    assert worst <= TOL, f"ppo x {correction} ({weighting}): max |g_tree - g_flat| = {worst:.3g}"


@pytest.mark.parametrize(
    ("cls", "cfg"),
    [
        (Learner.grpo, GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="mis_sequence")),
        (Learner.ppo, PPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="tis", minibatches=1)),
    ],
    ids=["grpo", "ppo"],
)
def test_tree_attention_gradient_equals_flat(tiny, cls, cfg, monkeypatch):
    """The same packed-vs-flat gradient check with the learner on block-sparse tree attention
    (no dense mask: DENSE_MAX_TOKENS = 0, query chunks of 64) instead of the dense mask."""
    monkeypatch.setattr(packing, "DENSE_MAX_TOKENS", 0)
    monkeypatch.setattr(_tree_attention, "_CPU_CHUNK", 64)
    seen = []
    orig = packing.preorder
    monkeypatch.setattr(packing, "preorder", lambda p: seen.append(len(p)) or orig(p))
    worst, _, _ = _compare(cls, cfg, tiny, "token", ppo=cls == Learner.ppo)
    assert seen  # the tree layout was used
    assert worst <= TOL, f"tree attention: max |g_tree - g_flat| = {worst:.3g}"


@pytest.mark.parametrize("agg", ["weights", "token_mean"])
def test_clip_frac_and_approx_kl_are_per_path(tiny, agg):
    """After the policy moved (second epoch), clip_frac and approx_kl of the packed batch equal
    the flat per-path batch's: each token counts with its mass in the loss, not once.

    adam_eps = 1 makes the first update ~ lr * g (not lr * sign g), so the 1e-7 gradient
    differences between the two runs stay 1e-7 in the weights."""
    cfg = GRPOConfig(
        lr=3.0, adam_eps=1.0, max_grad_norm=0.0, epochs=2, is_correction="none", loss_agg=agg
    )
    a = Learner.grpo(cfg, tiny)
    samples = _batch(a.policy.config.vocab_size, "rollout", ppo=False)
    _engine_logprobs(a, samples, seed=1)
    _, m_tree = _grads(a, samples)
    _, m_flat = _grads(Learner.grpo(cfg, tiny), _flat(samples))
    assert 0.05 < m_tree["clip_frac"] < 0.95 and m_tree["approx_kl"] > 1e-3  # the policy moved
    assert m_tree["clip_frac"] == pytest.approx(m_flat["clip_frac"], abs=1e-6)
    assert m_tree["approx_kl"] == pytest.approx(m_flat["approx_kl"], rel=1e-4)


# -- LoRA: the same combinations, the adapter's gradients -------------------------------------


def _lora_only(grads: dict) -> None:
    policy = [n for n in grads if n.startswith("policy.")]
    assert policy and all("lora_" in n for n in policy)  # only the adapter is trained
    assert any("lora_A" in n for n in policy) and any("lora_B" in n for n in policy)


@pytest.mark.parametrize(("agg", "correction", "weighting"), GRPO_CASES)
def test_grpo_lora_packed_gradient_equals_flat(tiny, agg, correction, weighting):
    """GRPO with a LoRA adapter (rank 4, all linear layers): the adapter's packed and flat
    per-path gradients agree to 1e-5 for every aggregator x correction."""
    pytest.importorskip("peft", reason="the lora extra is not installed")
    cfg = GRPOConfig(
        lr=1e-3,
        max_grad_norm=0.0,
        is_correction=correction,
        loss_agg=agg,
        constant_len=8,
        entropy_coef=0.01,
        lora_rank=4,
    )
    a = _learner(Learner.grpo, cfg, tiny)
    samples = _batch(a.policy.config.vocab_size, weighting, ppo=False)
    _engine_logprobs(a, samples, seed=1)
    g_tree, _ = _grads(a, samples)
    _lora_only(g_tree)
    worst, _, _ = _compare(Learner.grpo, cfg, tiny, weighting, ppo=False)
    assert worst <= TOL, f"lora {agg} x {correction} ({weighting}): {worst:.3g}"


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("weighting", ["token", "rollout"])
@pytest.mark.parametrize("center", [True, False], ids=["centred", "scaled"])
def test_ppo_lora_packed_gradient_equals_flat(tiny, correction, weighting, center):
    """PPO with a LoRA adapter on the policy (value head trained whole): packed and flat
    gradients of the adapter and the head agree to 1e-5."""
    pytest.importorskip("peft", reason="the lora extra is not installed")
    cfg = PPOConfig(
        lr=1e-3,
        max_grad_norm=0.0,
        is_correction=correction,
        epochs=1,
        minibatches=1,
        whiten_center=center,
        lora_rank=4,
    )
    worst, _, _ = _compare(Learner.ppo, cfg, tiny, weighting, ppo=True)
    assert worst <= TOL, f"lora ppo x {correction} ({weighting}): {worst:.3g}"
