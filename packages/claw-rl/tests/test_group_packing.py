"""Group-packed samples (claw-tree samples --pack group) train exactly like per-session ones.

Group packing puts the rollouts of one GRPO group into one tree in which the context prefix they
share (system prompt, tools, instruction: root to the first trainable token, leaves left out)
appears once. Trainable tokens keep their loss weights, advantages, logprobs and returns, and
every path keeps its tokens and positions, so the learner's loss and gradient must equal those
of the per-session samples. The merge here is a reference written from that definition (a dict
keyed by the token prefix), independent of claw-tree's.

Tolerance as in test_packed_gradients.py: packing changes only the fp32 summation order.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig
from claw_rl.packing import leaf_counts

TOL = 1e-5


def _session(rng: random.Random, k: int, system: list[int], vocab: int, ppo: bool) -> dict:
    """One rollout: the shared system prompt, a main thread of two turns, a side branch inside
    the prompt (a sub-agent), and a context-only leaf; per-session loss weights 1/(R U)."""
    ids, parent, trainable = [], [], []

    def chain(start: int, tokens: list[int], train: int) -> int:
        for t in tokens:
            ids.append(t)
            parent.append(start)
            trainable.append(train)
            start = len(ids) - 1
        return start

    rand = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    end = chain(-1, system, 0)
    node = chain(end, rand(3), 1)  # first answer
    node = chain(node, rand(2), 0)  # tool result
    chain(node, rand(4), 1)  # second answer
    mid = len(system) // 2 - 1
    node = chain(mid, rand(2), 0)  # sub-agent: branches inside the prompt
    chain(node, rand(3), 1)
    chain(end, [7, 8], 0)  # a context-only call (e.g. token counting): a leaf, never merged
    n = len(ids)
    pos = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    tr = np.asarray(trainable, dtype=bool)
    row = {
        "schema": "claw.sample/v1",
        "sample_id": f"r{k}",
        "algo": "ppo" if ppo else "grpo",
        "input_ids": ids,
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": [0.0] * n,
        "advantages": np.where(tr, rng.uniform(-1, 1), 0.0).tolist(),
        "loss_weights": (tr / (3 * tr.sum())).tolist(),
        "tags": {"path_weighting": "token"},
    }
    if ppo:
        row["returns"] = [rng.uniform(-1, 1) if t else 0.0 for t in trainable]
    return row


def _merge_group(samples: list[dict]) -> dict:
    """Reference group packing: concatenate the samples, then keep one copy of every inner
    context-prefix node, identified by its token prefix."""
    per_token = ("input_ids", "position_ids", "trainable", "logprobs", "advantages")
    per_token += ("loss_weights",) + (("returns",) if "returns" in samples[0] else ())
    out: dict = {k: [] for k in (*per_token, "parent")}
    seen: dict[tuple, int] = {}  # token prefix of a merged node -> its index in out
    for s in samples:
        inner = set(s["parent"])
        prefix: list[tuple] = []
        index: list[int] = []  # this sample's token -> index in out
        for i, p in enumerate(s["parent"]):
            key = (prefix[p] if p >= 0 else ()) + (s["input_ids"][i],)
            prefix.append(key)
            context_prefix = not s["trainable"][i] and (p < 0 or prefix[p] in seen)
            if context_prefix and i in inner and key in seen:
                index.append(seen[key])
                continue
            index.append(len(out["input_ids"]))
            if context_prefix and i in inner:
                seen[key] = index[-1]
            for k in per_token:
                out[k].append(s[k][i])
            out["parent"].append(index[p] if p >= 0 else -1)
    return {
        **{k: v for k, v in samples[0].items() if k not in out},
        **out,
        "sample_id": "group",
    }


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
    sessions = [_session(rng, k, system, vocab, ppo) for k in range(3)]
    # engine logprobs near the learner's, some far off, so the corrections act
    noise = np.random.default_rng(0)
    for s, lp in zip(sessions, learner.logprobs(sessions), strict=True):
        bump = np.where(noise.random(len(lp)) < 0.2, noise.choice([-0.9, 0.9], len(lp)), 0.0)
        s["logprobs"] = np.where(s["trainable"], np.asarray(lp) - bump, 0.0).tolist()
    group = _merge_group(sessions)
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
