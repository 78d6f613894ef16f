"""Group-packed samples (claw-tree samples --pack group) train exactly like per-session ones.

Group packing puts the rollouts of one GRPO group into one tree in which the context prefix they
share (system prompt, tools, instruction: root to the first trainable token, leaves left out)
appears once. Trainable tokens keep their loss weights, advantages, logprobs and returns, and
every path keeps its tokens and positions, so the learner's loss and gradient must equal those
of the per-session samples. The merge (rl_testlib.merge_group) is a reference written from that
definition (a dict keyed by the token prefix), independent of claw-tree's.

Batch packing (claw-tree samples --pack batch) merges the groups of several tasks of one
harness the same way: the system prompt once per sample, each task's instruction once per group,
every rollout keeping its group-relative advantage; it must train like per-session samples too.

Tolerance as in test_packed_gradients.py: packing changes only the fp32 summation order.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig
from claw_rl.packing import leaf_counts
from rl_testlib import group_rollout, merge_group

TOL = 1e-5


def _grads(learner, samples: list[dict]) -> tuple[dict, dict]:
    """One step; the gradient of every trained parameter as the optimizer saw it."""
    seen: dict[str, torch.Tensor] = {}
    orig = learner.optimizer.step
    modules = learner.trained_modules()

    def capture(*a, **kw):
        for name, m in modules.items():
            for n, p in m.named_parameters():
                if p.grad is not None:
                    seen[f"{name}.{n}"] = p.grad.detach().clone()
        return orig(*a, **kw)

    learner.optimizer.step = capture
    return seen, learner.step(samples)


CASES = [
    ("grpo", "weights", "tis"),
    ("grpo", "weights", "mis_sequence"),
    ("grpo", "token_mean", "mis_token"),
    ("grpo", "constant", "none"),
    ("ppo", "weights", "tis"),
]


@pytest.mark.parametrize(("algo", "agg", "correction"), CASES)
def test_group_packed_gradient_equals_session_packed(tiny, algo, agg, correction):
    """Loss and gradient of one group-packed sample equal those of its three per-session
    samples, for GRPO (several aggregators x corrections) and PPO (value head)."""
    ppo = algo == "ppo"
    if ppo:
        # one optimizer step: minibatches are made of samples, so more than one would cut the
        # per-session and the group batch into different minibatches
        make = Learner.ppo
        cfg = PPOConfig(
            lr=1e-3, max_grad_norm=0.0, is_correction=correction, epochs=1, minibatches=1
        )
    else:
        make = Learner.grpo
        cfg = GRPOConfig(
            lr=1e-3, max_grad_norm=0.0, is_correction=correction, loss_agg=agg, constant_len=8
        )
    learner = make(cfg, tiny)
    vocab = learner.policy.config.vocab_size
    rng = random.Random(3)
    system = [rng.randrange(3, vocab) for _ in range(12)]
    sessions = [group_rollout(rng, k, system, vocab, ppo) for k in range(3)]
    # engine logprobs near the learner's, some far off, so the corrections act
    noise = np.random.default_rng(0)
    for s, lp in zip(sessions, learner.logprobs(sessions), strict=True):
        bump = np.where(noise.random(len(lp)) < 0.2, noise.choice([-0.9, 0.9], len(lp)), 0.0)
        s["logprobs"] = np.where(s["trainable"], np.asarray(lp) - bump, 0.0).tolist()
    group = merge_group(sessions)
    n_sessions = sum(len(s["input_ids"]) for s in sessions)
    # the prompt and the context-only call's inner token appear once
    assert len(group["input_ids"]) == n_sessions - 2 * (len(system) + 1)
    assert sum(leaf_counts(group["parent"])[np.asarray(group["parent"]) == -1]) == 9  # paths kept
    g_group, m_group = _grads(learner, [group])
    g_sessions, m_sessions = _grads(make(cfg, tiny), sessions)
    assert set(g_group) == set(g_sessions) and g_group
    worst = max(float((g_group[n] - g_sessions[n]).abs().max()) for n in g_group)
    scale = max(float(g.abs().max()) for g in g_sessions.values())
    assert scale > 1e-3  # not two zero gradients
    assert worst <= TOL, f"{algo} {agg} {correction}: max |g_group - g_sessions| = {worst:.3g}"
    assert m_group["loss"] == pytest.approx(m_sessions["loss"], abs=1e-6)
    assert m_group["tokens"] < m_sessions["tokens"]
    # the tree ratio is that of the samples trained: group packing's shared prefix shows in it
    assert m_group["flat_tokens"] == m_sessions["flat_tokens"]
    assert m_group["tree_ratio"] == pytest.approx(m_group["flat_tokens"] / m_group["tokens"])
    assert m_group["tree_ratio"] > m_sessions["tree_ratio"]


def test_a_stale_session_leaves_its_group_siblings_training(tiny):
    """Staleness is decided per session: with one of three rollouts of a group two versions
    behind (bound 1), the group-packed sample trains its two fresh rollouts, with the loss and
    gradient of their two per-session samples (the stale one dropped)."""
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, max_staleness=1, drop_stale=True)
    learner = Learner.grpo(cfg, tiny, version=3)
    vocab = learner.policy.config.vocab_size
    rng = random.Random(5)
    system = [rng.randrange(3, vocab) for _ in range(12)]
    sessions = [group_rollout(rng, k, system, vocab, False) for k in range(3)]
    for k, s in enumerate(sessions):
        version = 1 if k == 1 else 3  # the middle rollout is 2 versions old
        s["policy_versions"] = [version if t else -1 for t in s["trainable"]]
    for s, lp in zip(sessions, learner.logprobs(sessions), strict=True):
        s["logprobs"] = np.where(s["trainable"], lp, 0.0).tolist()
    group = merge_group(sessions)
    g_group, m_group = _grads(learner, [group])
    fresh = [sessions[0], sessions[2]]
    g_fresh, m_fresh = _grads(Learner.grpo(cfg, tiny, version=3), fresh)
    assert (m_group["stale_sessions"], m_group["dropped_stale"], m_group["samples"]) == (1, 1, 1)
    assert m_group["stale_samples"] == 1 and m_group["staleness_max"] == 2
    assert set(g_group) == set(g_fresh) and g_group
    worst = max(float((g_group[n] - g_fresh[n]).abs().max()) for n in g_group)
    scale = max(float(g.abs().max()) for g in g_fresh.values())
    assert scale > 1e-3  # not two zero gradients
    assert worst <= TOL, f"max |g_group - g_fresh| = {worst:.3g}"
    assert m_group["loss"] == pytest.approx(m_fresh["loss"], abs=1e-6)
    # the stale rollout's own tokens left the sample; the shared system prompt stayed
    assert m_group["tokens"] == len(merge_group(fresh)["input_ids"])


@pytest.mark.parametrize(("algo", "agg", "correction"), CASES)
def test_batch_packed_gradient_equals_session_packed(tiny, algo, agg, correction):
    """Two groups of three (one system prompt, each task its own instruction and advantages) in
    one batch-packed sample: the loss and gradient of the six per-session samples."""
    ppo = algo == "ppo"
    if ppo:
        make = Learner.ppo
        cfg = PPOConfig(
            lr=1e-3, max_grad_norm=0.0, is_correction=correction, epochs=1, minibatches=1
        )
    else:
        make = Learner.grpo
        cfg = GRPOConfig(
            lr=1e-3, max_grad_norm=0.0, is_correction=correction, loss_agg=agg, constant_len=8
        )
    learner = make(cfg, tiny)
    vocab = learner.policy.config.vocab_size
    rng = random.Random(7)
    system = [rng.randrange(3, vocab) for _ in range(12)]
    tasks = [[rng.randrange(3, vocab) for _ in range(4)] for _ in range(2)]
    sessions = [
        group_rollout(rng, 3 * t + k, system + tasks[t], vocab, ppo)
        for t in (0, 1)
        for k in range(3)
    ]
    for s in sessions:  # six rollouts vote: per-session loss weights 1/(R U), R = 6
        s["loss_weights"] = (np.asarray(s["loss_weights"]) / 2).tolist()
    noise = np.random.default_rng(1)
    for s, lp in zip(sessions, learner.logprobs(sessions), strict=True):
        bump = np.where(noise.random(len(lp)) < 0.2, noise.choice([-0.9, 0.9], len(lp)), 0.0)
        s["logprobs"] = np.where(s["trainable"], np.asarray(lp) - bump, 0.0).tolist()
    batch = merge_group(sessions)
    groups = [merge_group(sessions[:3]), merge_group(sessions[3:])]
    n_groups = sum(len(g["input_ids"]) for g in groups)
    # the system prompt (and the sub-agent's branch point inside it) once, not once per group
    assert len(batch["input_ids"]) == n_groups - len(system)
    g_batch, m_batch = _grads(learner, [batch])
    g_sessions, m_sessions = _grads(make(cfg, tiny), sessions)
    assert set(g_batch) == set(g_sessions) and g_batch
    worst = max(float((g_batch[n] - g_sessions[n]).abs().max()) for n in g_batch)
    assert max(float(g.abs().max()) for g in g_sessions.values()) > 1e-3
    assert worst <= TOL, f"{algo} {agg} {correction}: max |g_batch - g_sessions| = {worst:.3g}"
    assert m_batch["loss"] == pytest.approx(m_sessions["loss"], abs=1e-6)
    assert m_batch["flat_tokens"] == m_sessions["flat_tokens"]
    assert m_batch["tokens"] < sum(len(g["input_ids"]) for g in groups) < m_sessions["tokens"]
