"""claw-tree `--pack group` samples train exactly like `--pack session` samples in claw-rl.

Three rollouts of one task share a system prompt; each has a main thread, a branch (a
compaction restart from the prompt) and a side call. claw-tree packs them per session and per
group; one claw-rl GRPO and one PPO step on each must see the same loss and gradient. Batch
packing (`--pack batch`) puts the groups of two tasks in one tree (the system prompt once, each
task's instruction once); it must train like per-session packing too.
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


def _calls(
    n: int = 3, versions: tuple[int, ...] = (0, 0, 0), tasks: int = 1
) -> tuple[list[dict], list[dict]]:
    """``n`` rollouts of each of ``tasks`` tasks (sessions r0.. for one task, t<k>-r<r> for
    several; the prompt is the system prompt, then the task's 5-token instruction)."""
    rng = random.Random(0)
    ids = lambda k: [rng.randrange(3, 1000) for _ in range(k)]  # noqa: E731
    system = ids(30)
    instructions = [ids(5) for _ in range(tasks)] if tasks > 1 else [[]]
    calls, outcomes = [], []
    for t, r in [(t, r) for t in range(tasks) for r in range(n)]:
        s = f"r{r}" if tasks == 1 else f"t{t}-r{r}"
        task = "t" if tasks == 1 else f"t{t}"
        seqs = []
        a1 = ids(4)
        start = system + instructions[t]
        seqs.append((start, a1))
        seqs.append((start + a1 + ids(5), ids(3)))  # next turn
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
                    "policy": {"name": "tiny", "version": versions[r % len(versions)]},
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
                "task": task,
                "harness": "h",
                "group": task,
                "reward": ((r + t) % 3) / 2,
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


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_batch_packed_samples_train_like_session_packed(tiny, algo):
    """Two groups of three in one batch-packed sample (the system prompt once, not once per
    group): same loss and gradient (1e-5) as the six session-packed samples."""
    calls, outcomes = _calls(tasks=2)
    forest = build_forest(calls)
    by_session = build_samples(forest, outcomes, algo=algo).samples
    by_group = build_samples(forest, outcomes, algo=algo, pack="group").samples
    (batch,) = build_samples(forest, outcomes, algo=algo, pack="batch").samples
    n_session = sum(len(s["input_ids"]) for s in by_session)
    assert sum(len(s["input_ids"]) for s in by_group) == n_session - 2 * 2 * (30 + 5)
    assert len(batch["input_ids"]) == n_session - 2 * 2 * (30 + 5) - 30
    assert batch["groups"] == ["t0"] * 3 + ["t1"] * 3
    if algo == "ppo":
        make = Learner.ppo
        cfg = PPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="none", minibatches=1, epochs=1)
    else:
        make = Learner.grpo
        cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="none")
    g_batch, m_batch = _step(make(cfg, tiny), [batch])
    g_session, m_session = _step(make(cfg, tiny), by_session)
    assert g_batch.keys() == g_session.keys() and g_batch
    assert max(float(g.abs().max()) for g in g_session.values()) > 1e-3
    worst = max(float((g_batch[k] - g_session[k]).abs().max()) for k in g_batch)
    assert worst <= 1e-5
    assert m_batch["loss"] == pytest.approx(m_session["loss"], abs=1e-6)
    assert m_batch["flat_tokens"] == m_session["flat_tokens"]


def test_a_stale_rollout_drops_alone_from_its_batch_sample(tiny):
    """In a batch-packed sample of two groups, the rollouts answered by a policy 2 versions old
    (r1 of each task; bound 1, drop_stale) drop alone: the sample trains the other four with the
    loss and gradient of their session samples, the system prompt once."""
    calls, outcomes = _calls(versions=(2, 0, 2), tasks=2)
    forest = build_forest(calls)
    stale = {"t0-r1", "t1-r1"}
    fresh = [s for s in build_samples(forest, outcomes).samples if stale.isdisjoint(s["sessions"])]
    (batch,) = build_samples(forest, outcomes, pack="batch").samples
    cfg = GRPOConfig(
        lr=1e-3, max_grad_norm=0.0, is_correction="none", max_staleness=1, drop_stale=True
    )
    g_batch, m_batch = _step(Learner.grpo(cfg, tiny, version=2), [batch])
    g_fresh, m_fresh = _step(Learner.grpo(cfg, tiny, version=2), fresh)
    assert (m_batch["dropped_stale"], m_batch["stale_sessions"], m_batch["samples"]) == (2, 2, 1)
    assert max(float(g.abs().max()) for g in g_fresh.values()) > 1e-3
    worst = max(float((g_batch[k] - g_fresh[k]).abs().max()) for k in g_batch)
    assert worst <= 1e-5
    assert m_batch["loss"] == pytest.approx(m_fresh["loss"], abs=1e-6)
    assert m_batch["flat_tokens"] == m_fresh["flat_tokens"]
    # per task: 2 fresh rollouts share the instruction; both tasks share the system prompt
    assert m_batch["tokens"] == sum(len(s["input_ids"]) for s in fresh) - 2 * 35 - 30
