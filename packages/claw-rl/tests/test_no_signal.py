"""A step without learning signal leaves the policy, its optimizer state and its version alone
(issue 39 item 9): AdamW's momentum and weight decay would otherwise move every weight, and the
loop would publish a new version for the engines to reload."""

from __future__ import annotations

import copy

import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig, loop, save_policy
from rl_testlib import tree_sample

PARENT = [-1, 0, 1, 2, 2, 4, 3, 1, 7]
TRAIN = [0, 0, 1, 1, 1, 1, 1, 0, 1]


def _signal(seed: int = 0, returns: bool = False) -> dict:
    return tree_sample(PARENT, TRAIN, seed=seed, sample_id=f"s{seed}", returns=returns)


def _zero(seed: int = 5) -> dict:
    """Every advantage exactly 0: a group whose rewards were all equal."""
    return dict(_signal(seed), sample_id=f"z{seed}", advantages=[0.0] * len(PARENT))


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors are not bit-identical (every tensor, not a sample)."""
    assert a.keys() == b.keys() and a
    return [k for k in a if not torch.equal(a[k], b[k])]


def _optimizer_state(learner: Learner) -> dict:
    return copy.deepcopy(learner.optimizer.state_dict())


def _same_state(a: dict, b: dict) -> bool:
    sa, sb = a["state"], b["state"]
    return sa.keys() == sb.keys() and all(
        sa[k].keys() == sb[k].keys() and all(torch.equal(sa[k][n], sb[k][n]) for n in sa[k])
        for k in sa
    )


@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig(lr=1e-2, weight_decay=0.1, max_grad_norm=0.0),
        GRPOConfig(lr=1e-2, kl_coef=0.5, entropy_coef=0.1, epochs=2, minibatches=2),
    ],
    ids=["adamw-momentum-and-decay", "kl-and-entropy-terms"],
)
def test_a_step_without_signal_changes_no_weight_and_no_optimizer_state(tiny, tmp_path, cfg):
    """After a step with signal (AdamW has momentum), a step whose advantages are all 0 leaves
    every parameter bit-identical and the optimizer state (moments, step counts) unchanged; it
    reports no_signal, skipped and policy_updates 0, and the next save keeps the version."""
    learner = Learner.grpo(cfg, tiny)
    learner.step([_signal(0), _signal(1)])
    assert save_policy(learner, tmp_path / "v1")["version"] == 1
    before, state = _weights(learner.policy), _optimizer_state(learner)
    m = learner.step([_zero(5), _zero(6)])
    assert m["no_signal"] is True and "every advantage is 0" in m["no_signal_reason"]
    assert _same(before, _weights(learner.policy)) == []
    assert _same_state(state, _optimizer_state(learner))
    assert m["policy_updates"] == 0 and m["skipped"].startswith("no signal")
    assert learner.dirty is False and learner.step_count == 2
    rec = save_policy(learner, tmp_path / "again")
    assert rec["version"] == 1
    m = learner.step([_signal(2)])  # a batch with signal trains again
    assert m["policy_updates"] == cfg.epochs * 1 and "skipped" not in m
    assert _same(before, _weights(learner.policy))


def test_a_skipped_step_does_not_advance_the_schedule_or_the_shuffling(tiny):
    """signal, no signal, signal gives bit-for-bit the weights of signal, signal: the skipped step
    takes no learning-rate warmup step and draws no minibatch permutation."""
    cfg = GRPOConfig(lr=1e-2, warmup_steps=4, epochs=2, minibatches=2, micro_batch_size=1)
    a = Learner.grpo(cfg, tiny)
    b = Learner.grpo(cfg, tiny)
    a.step([_signal(0), _signal(1)])
    a.step([_zero(5), _zero(6)])
    a.step([_signal(2), _signal(3)])
    b.step([_signal(0), _signal(1)])
    b.step([_signal(2), _signal(3)])
    assert _same(_weights(a.policy), _weights(b.policy)) == []
    assert _same_state(_optimizer_state(a), _optimizer_state(b))


def test_ppo_without_policy_signal_trains_only_its_critic(tiny, tmp_path):
    """PPO whose whitened advantages are all 0 (equal advantages, centred): the policy keeps
    every weight and its optimizer state, the value head (whose loss has a target) learns, and
    the learner keeps its version."""
    learner = Learner.ppo(PPOConfig(lr=1e-2, critic_lr=1e-2), tiny)
    learner.step([_signal(0, returns=True)])
    assert save_policy(learner, tmp_path / "v1")["version"] == 1
    same = _signal(1, returns=True)
    same["advantages"] = [0.5 * t for t in TRAIN]
    policy, head = _weights(learner.policy), _weights(learner.critic.head)
    policy_state = {
        k: copy.deepcopy(v)
        for k, v in learner.optimizer.state.items()
        if any(k is p for p in learner.optimizer.param_groups[0]["params"])
    }
    m = learner.step([same])
    assert m["no_signal"] is True and "whitening" in m["no_signal_reason"]
    assert _same(policy, _weights(learner.policy)) == []
    assert _same(head, _weights(learner.critic.head))  # the critic learned
    for p, st in policy_state.items():
        assert all(torch.equal(st[n], learner.optimizer.state[p][n]) for n in st)
    assert m["policy_updates"] == 0 and m["critic_updates"] == 2  # 2 epochs x 1 sample
    assert learner.dirty is False and m["value_loss"] > 0


def test_the_loop_publishes_no_new_version_for_a_step_without_signal(tiny, tmp_path):
    """train_step on a batch without signal: the policies row is the policy in force, its
    metrics row says no_signal and skipped, and no new policy directory is written."""
    learner = Learner.grpo(GRPOConfig(lr=1e-2), tiny)
    row, current = loop.train_step(learner, [_signal(0), _signal(1)], tmp_path, 0)
    assert current["version"] == 1
    dirs = sorted(p.name for p in (tmp_path / "policy").iterdir())
    row, policy = loop.train_step(learner, [_zero(5)], tmp_path, 1, current=current)
    assert policy == current and row["policy_version"] == 1
    assert row["no_signal"] is True and row["skipped"].startswith("no signal")
    assert row["learner"]["policy_updates"] == 0 and "no_signal_reason" in row["learner"]
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == dirs == ["v1"]
    assert [p["version"] for p in loop.read_rows(tmp_path / "policies.jsonl")] == [1, 1]
    resumed = loop.resume(tmp_path, algo="grpo")  # the checkpoint agrees: nothing to publish
    assert resumed.version == 1 and resumed.dirty is False


def test_claw_rl_train_keeps_the_version_over_a_batch_without_signal(tiny, tmp_path):
    """`claw-rl train` over a batch with signal, then one without: the policy records on stdout
    say v1 twice, only policy/v1 is written, and stderr says the second step was skipped."""
    import json

    from claw_rl.cli import main
    from click.testing import CliRunner

    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in [_signal(0), _zero(5)]))
    out = tmp_path / "out"
    args = [
        "train",
        "--algo",
        "grpo",
        "--model",
        str(tiny),
        "--samples",
        str(samples),
        "--output",
        str(out),
    ]
    r = CliRunner().invoke(main, [*args, "--batch-size", "1", "--lr", "1e-2"])
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [1, 1]
    assert sorted(p.name for p in (out / "policy").iterdir()) == ["v1"]
    assert "step 1: no signal: no optimizer step on the policy" in r.stderr
