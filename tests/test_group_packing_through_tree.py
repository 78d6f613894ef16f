"""claw-tree `--pack group` samples train exactly like `--pack session` samples in claw-rl.

Three rollouts of one task share a system prompt; each has a main thread, a branch (a
compaction restart from the prompt) and a side call. claw-tree packs them per session and per
group; one claw-rl GRPO and one PPO step on each must see the same loss and gradient.
"""

from __future__ import annotations

import random

import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig, init_tiny
from claw_tree import build_forest, build_samples


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny random Qwen3 model (built locally)."""
    return init_tiny(tmp_path_factory.mktemp("models") / "tiny")


def _calls(n: int = 3, versions: tuple[int, ...] = (0, 0, 0)) -> tuple[list[dict], list[dict]]:
    rng = random.Random(0)
    ids = lambda k: [rng.randrange(3, 1000) for _ in range(k)]  # noqa: E731
    system = ids(30)
    calls, outcomes = [], []
    for r in range(n):
        s = f"r{r}"
        seqs = []
        a1 = ids(4)
        seqs.append((system, a1))
        seqs.append((system + a1 + ids(5), ids(3)))  # next turn
        seqs.append((system[:20] + ids(6), ids(4)))  # compaction restart inside the prompt
        seqs.append((ids(8), ids(2)))  # side call with its own prompt
        for k, (prompt, completion) in enumerate(seqs):
            calls.append(
                {
                    "schema": "claw.call/v1",
                    "call_id": f"{s}-{k}",
                    "session": s,
                    "seq": k,
                    "api": "openai.chat",
                    "model": "policy",
                    "policy": {"name": "tiny", "version": versions[r]},
                    "trainable": True,
                    "prompt_ids": prompt,
                    "completion_ids": completion,
                    "completion_logprobs": [-rng.uniform(0.5, 3) for _ in completion],
                    "finish_reason": "stop",
                    "started_at": 1.0,
                    "ended_at": 2.0,
                    "tags": {},
                }
            )
        outcomes.append(
            {
                "schema": "claw.outcome/v1",
                "session": s,
                "task": "t",
                "harness": "h",
                "group": "t",
                "reward": r / 2,
                "passed": r > 0,
                "status": "ok",
            }
        )
    return calls, outcomes


def _step(learner, samples) -> tuple[dict, dict]:
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


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_group_packed_samples_train_like_session_packed(tiny, algo):
    """Same loss and gradient (1e-5) from claw-tree's group- and session-packed samples."""
    calls, outcomes = _calls()
    forest = build_forest(calls)
    by_session = build_samples(forest, outcomes, algo=algo).samples
    (group,) = build_samples(forest, outcomes, algo=algo, pack="group").samples
    assert len(group["input_ids"]) == sum(len(s["input_ids"]) for s in by_session) - 2 * 30
    if algo == "ppo":
        make = Learner.ppo
        cfg = PPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="none", minibatches=1, epochs=1)
    else:
        make = Learner.grpo
        cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="none")
    g_group, m_group = _step(make(cfg, tiny), [group])
    g_session, m_session = _step(make(cfg, tiny), by_session)
    assert g_group.keys() == g_session.keys() and g_group
    assert max(float(g.abs().max()) for g in g_session.values()) > 1e-3
    worst = max(float((g_group[k] - g_session[k]).abs().max()) for k in g_group)
    assert worst <= 1e-5
    assert m_group["loss"] == pytest.approx(m_session["loss"], abs=1e-6)


@pytest.mark.parametrize("stale", [0, 1])
def test_a_stale_rollout_drops_alone_from_its_group_sample(tiny, stale):
    """Rollout `stale` answered by a policy 2 versions old (bound 1, drop_stale): the group
    sample trains the other two with the loss and gradient of their session samples, and the
    tree ratio counts only what was trained."""
    versions = tuple(0 if r == stale else 2 for r in range(3))
    calls, outcomes = _calls(versions=versions)
    forest = build_forest(calls)
    fresh = [s for s in build_samples(forest, outcomes).samples if s["sessions"] != [f"r{stale}"]]
    (group,) = build_samples(forest, outcomes, pack="group").samples
    cfg = GRPOConfig(
        lr=1e-3, max_grad_norm=0.0, is_correction="none", max_staleness=1, drop_stale=True
    )
    g_group, m_group = _step(Learner.grpo(cfg, tiny, version=2), [group])
    g_fresh, m_fresh = _step(Learner.grpo(cfg, tiny, version=2), fresh)
    assert (m_group["dropped_stale"], m_group["stale_sessions"], m_group["samples"]) == (1, 1, 1)
    assert max(float(g.abs().max()) for g in g_fresh.values()) > 1e-3
    worst = max(float((g_group[k] - g_fresh[k]).abs().max()) for k in g_group)
    assert worst <= 1e-5
    assert m_group["loss"] == pytest.approx(m_fresh["loss"], abs=1e-6)
    assert m_group["flat_tokens"] == m_fresh["flat_tokens"]
    assert m_group["tokens"] == sum(len(s["input_ids"]) for s in fresh) - 30  # one shared prompt
