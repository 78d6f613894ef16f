"""The learners: tree-packed updates equal flat ones, consistency report, staleness, saving,
checkpoint/resume bit-for-bit, and the critic (value head and separate model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from claw_rl import (
    ClawError,
    ConfigError,
    GRPOConfig,
    Learner,
    Policy,
    PPOConfig,
    SFTConfig,
    load_checkpoint,
    losses,
    save_checkpoint,
    save_policy,
)
from claw_rl.packing import path_matrix
from rl_testlib import tree_sample
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

PARENT = [-1, 0, 1, 2, 2, 4, 3, 1, 7]  # three paths sharing a 2-token root prefix
TRAIN = [0, 0, 1, 1, 1, 1, 1, 0, 1]


def _tree_and_flat(vocab: int, returns: bool = False):
    """A branching sample with weights pi_p/T_p, and the same data as one chain per path."""
    base = tree_sample(PARENT, TRAIN, seed=3, vocab=vocab, returns=returns)
    paths = path_matrix(PARENT)
    T = [int(sum(TRAIN[j] for j in np.nonzero(row)[0])) for row in paths]
    w = [
        sum(1 / len(paths) / T[p] for p in range(len(paths)) if paths[p, i]) * TRAIN[i]
        for i in range(len(PARENT))
    ]
    tree = dict(base, loss_weights=w)
    flat = []
    for p, row in enumerate(paths):
        idx = np.nonzero(row)[0].tolist()
        n = len(idx)
        s = {
            k: [base[k][j] for j in idx]
            for k in ("input_ids", "trainable", "logprobs", "advantages")
        }
        s.update(
            schema="claw.sample/v1",
            sample_id=f"path{p}",
            algo=base["algo"],
            position_ids=list(range(n)),
            parent=list(range(-1, n - 1)),
            loss_weights=[t / len(paths) / T[p] for t in s["trainable"]],
        )
        if returns:
            s["returns"] = [base["returns"][j] for j in idx]
        flat.append(s)
    return tree, flat


def _grads_after_step(learner, samples):
    """Run one step with lr ~ 0 and return the summed gradient as the optimizer saw it."""
    seen = {}
    orig = learner.optimizer.step

    def capture(*a, **kw):
        for n, p in learner.policy.named_parameters():
            seen[n] = p.grad.detach().clone()
        return orig(*a, **kw)

    learner.optimizer.step = capture
    metrics = learner.step(samples)
    return seen, metrics


def test_tree_packed_loss_equals_flat_per_path_loss(tiny):
    """One tree sample and its paths as separate chains give the same loss and dedup factor
    (gradients, for every aggregator x correction: test_packed_gradients.py)."""
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0)
    vocab = Learner.grpo(cfg, tiny).policy.config.vocab_size
    tree, flat = _tree_and_flat(vocab)
    g_tree, m_tree = _grads_after_step(Learner.grpo(cfg, tiny), [tree])
    g_flat, m_flat = _grads_after_step(Learner.grpo(cfg, tiny), flat)
    assert m_tree["loss"] == pytest.approx(m_flat["loss"], abs=1e-6)
    assert max(float((g_tree[n] - g_flat[n]).abs().max()) for n in g_tree) < 1e-5
    assert m_tree["dedup_factor"] == pytest.approx(
        sum(len(f["input_ids"]) for f in flat) / len(PARENT)
    )
    # the tree ratio of the trained samples: flat per-trajectory tokens over packed ones
    assert m_tree["flat_tokens"] == m_flat["flat_tokens"] == sum(len(f["input_ids"]) for f in flat)
    assert m_tree["tree_ratio"] == pytest.approx(m_tree["flat_tokens"] / len(PARENT))
    assert m_flat["tree_ratio"] == 1.0


def test_single_path_sample_gives_the_ordinary_loss(tiny):
    """A chain sample's loss is the plain per-token mean of -A * logp-ratio terms (ratio 1)."""
    learner = Learner.grpo(GRPOConfig(is_correction="none"), tiny)
    s = tree_sample(
        [-1, 0, 1, 2, 3], [0, 0, 1, 1, 1], seed=1, vocab=learner.policy.config.vocab_size
    )
    m = learner.step([s])
    # at epoch 1 pi_theta = pi_old, so l_i = -A_i and the loss is the mean over the 3 tokens
    assert m["loss"] == pytest.approx(-sum(s["advantages"]) / 3, abs=1e-6)
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("agg", ["weights", "token_mean"])
def test_masked_tokens_leave_the_denominator(tiny, agg):
    """Token MIS drops the token whose rho = e > is_cap: the loss is the mean of -A over the
    other tokens (denominator 2, not 3), as if the masked token had never been in the batch."""
    learner = Learner.grpo(GRPOConfig(is_correction="mis_token", loss_agg=agg), tiny)
    s = tree_sample(
        [-1, 0, 1, 2, 3], [0, 0, 1, 1, 1], seed=1, vocab=learner.policy.config.vocab_size
    )
    own = learner.logprobs([s])[0]
    own[3] -= 1.0  # engine logprob 1 nat lower: rho = pi_old / pi_engine = e
    m = learner.step([dict(s, logprobs=own)])
    assert m["loss"] == pytest.approx(-(s["advantages"][2] + s["advantages"][4]) / 2, abs=1e-6)
    assert m["is_weight_mean"] == pytest.approx(2 / 3)


def test_mismatch_is_zero_for_own_logprobs_and_reported_when_perturbed(tiny):
    """Engine logprobs equal to the learner's give ~0 mismatch; +0.5 on two tokens is counted."""
    learner = Learner.grpo(GRPOConfig(lr=1e-9, mismatch_threshold=0.1), tiny)
    s = tree_sample(PARENT, TRAIN, seed=5, vocab=learner.policy.config.vocab_size)
    own = learner.logprobs([s])[0]
    m = learner.step([dict(s, logprobs=own)])
    assert m["mismatch_max_abs"] < 1e-5 and m["mismatch_frac_beyond"] == 0.0
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    bumped = list(own)
    bumped[2] += 0.5
    bumped[8] -= 0.5
    m = learner.step([dict(s, logprobs=bumped)])
    assert m["mismatch_frac_beyond"] == pytest.approx(2 / sum(TRAIN))
    assert m["mismatch_max_abs"] == pytest.approx(0.5, abs=1e-3)


def test_staleness_is_reported_and_optionally_dropped(tiny):
    """With the learner at version 3, a version-0 sample is stale (bound 1) and can be dropped."""
    vocab = 2000
    fresh = tree_sample([-1, 0, 1], [0, 1, 1], sample_id="fresh", vocab=vocab, versions=[-1, 3, 3])
    old = tree_sample([-1, 0, 1], [0, 1, 1], sample_id="old", vocab=vocab, versions=[-1, 0, 0])
    m = Learner.grpo(GRPOConfig(), tiny, version=3).step([fresh, old])
    assert (m["stale_samples"], m["staleness_max"], m["samples"], m["dropped_stale"]) == (
        1,
        3,
        2,
        0,
    )
    m = Learner.grpo(GRPOConfig(drop_stale=True), tiny, version=3).step([fresh, old])
    assert (m["stale_samples"], m["samples"], m["dropped_stale"]) == (1, 1, 1)
    with pytest.raises(ClawError, match="stale"):
        Learner.grpo(GRPOConfig(drop_stale=True), tiny, version=3).step([old])


def test_a_step_without_learning_signal_says_so(tiny, caplog):
    """All advantages 0 (every group's rewards equal): the step's metrics carry no_signal with
    the reason and a warning goes to the claw_rl logger (stderr); PPO's centred whitening of
    advantages that are all equal is no signal either; advantages that differ are."""
    zero = dict(tree_sample(PARENT, TRAIN, vocab=2000), advantages=[0.0] * len(PARENT))
    with caplog.at_level("WARNING", logger="claw_rl"):
        m = Learner.grpo(GRPOConfig(), tiny).step([zero])
    assert m["no_signal"] is True and "every advantage is 0" in m["no_signal_reason"]
    assert m["zero_adv_frac"] == 1.0 and "NO LEARNING SIGNAL" in caplog.text
    caplog.clear()
    m = Learner.grpo(GRPOConfig(), tiny).step([tree_sample(PARENT, TRAIN, vocab=2000)])
    assert m["no_signal"] is False and "no_signal_reason" not in m and not caplog.text
    same = tree_sample(PARENT, TRAIN, vocab=2000, returns=True)
    same["advantages"] = [0.5 * t for t in TRAIN]
    m = Learner.ppo(PPOConfig(), tiny).step([same])
    assert m["no_signal"] is True and "whitening" in m["no_signal_reason"]
    massless = dict(zero, advantages=[float(t) for t in TRAIN], loss_weights=[0.0] * len(PARENT))
    m = Learner.grpo(GRPOConfig(), tiny).step([massless])
    assert m["no_signal_reason"] == "no trainable token carries loss weight"


def test_save_writes_an_hf_dir_and_a_policy_record(tiny, tmp_path):
    """The saved directory loads with AutoModelForCausalLM and holds the new weights."""
    learner = Learner.grpo(GRPOConfig(lr=1e-3, name="tiny"), tiny)
    learner.step([tree_sample(PARENT, TRAIN, vocab=2000)])
    rec = save_policy(learner, tmp_path / "v1")
    pol = Policy.from_dict(rec)
    assert (pol.name, pol.version, pol.step) == ("tiny", 1, 1)
    assert pol.metrics["loss"] == learner.last_metrics["loss"]
    json.dumps(rec, allow_nan=False)
    loaded = AutoModelForCausalLM.from_pretrained(pol.path)
    for (n, p), (_, q) in zip(
        learner.policy.named_parameters(), loaded.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    assert (tmp_path / "v1" / "tokenizer.json").exists()
    assert (
        save_policy(learner, tmp_path / "again")["version"] == 1
    )  # unchanged weights keep their version
    with pytest.raises(ClawError, match="not empty"):
        learner.step([tree_sample(PARENT, TRAIN, vocab=2000)])
        save_policy(learner, tmp_path / "v1")
    assert learner.version == 1  # the refused save did not take a version number
    assert save_policy(learner, tmp_path / "v2")["version"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo-head", "ppo-model"])
def test_checkpoint_resume_is_bit_for_bit(tiny, tmp_path, algo):
    """2 steps straight == 1 step, checkpoint, resume, 1 step: identical weights and optimizer."""
    if algo == "grpo":
        cls, cfg = Learner.grpo, GRPOConfig(lr=1e-3, epochs=2, minibatches=2, micro_batch_size=1)
    else:
        cls, cfg = Learner.ppo, PPOConfig(lr=1e-3, critic=algo[4:], micro_batch_size=1)
    batches = [
        [
            tree_sample(
                PARENT, TRAIN, seed=10 * k + j, sample_id=f"{k}-{j}", vocab=2000, returns=True
            )
            for j in range(3)
        ]
        for k in range(2)
    ]
    if algo == "grpo":
        batches = [
            [{**{k: v for k, v in s.items() if k != "returns"}, "algo": "grpo"} for s in b]
            for b in batches
        ]
    straight = cls(cfg, tiny)
    m_a = [straight.step(b) for b in batches]
    half = cls(cfg, tiny)
    half.step(batches[0])
    save_checkpoint(half, tmp_path / "ckpt")
    resumed = load_checkpoint(tmp_path / "ckpt")
    m_b = resumed.step(batches[1])
    for (n, p), (_, q) in zip(
        straight.policy.named_parameters(), resumed.policy.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    if algo != "grpo":
        for p, q in zip(
            straight.critic.head.parameters(), resumed.critic.head.parameters(), strict=True
        ):
            assert torch.equal(p, q)
    assert m_a[1]["loss"] == m_b["loss"] and resumed.step_count == 2


def test_a_resumed_learner_saves_after_its_checkpoint_is_removed(tiny, tmp_path):
    """A learner resumed from a checkpoint takes its tokenizer files from the run's origin, not
    from the checkpoint (the loop removes old checkpoints): saving after the checkpoint it was
    loaded from is gone still writes a whole HF directory."""
    learner = Learner.grpo(GRPOConfig(lr=1e-3), tiny)
    save_checkpoint(learner, tmp_path / "ckpt")
    resumed = load_checkpoint(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    save_checkpoint(resumed, tmp_path / "ckpt2")
    save_policy(resumed, tmp_path / "policy")
    for d in (tmp_path / "ckpt2" / "model", tmp_path / "policy"):
        assert (d / "tokenizer.json").read_bytes() == (Path(tiny) / "tokenizer.json").read_bytes()


def _lrs_of_one_step(learner, batch) -> list[float]:
    """The learning rate of each optimizer step of one learner.step(batch)."""
    seen: list[float] = []
    orig = learner.optimizer.step

    def capture(*a, **kw):
        seen.append(learner.optimizer.param_groups[0]["lr"])
        return orig(*a, **kw)

    learner.optimizer.step = capture
    learner.step(batch)
    return seen


def _two_samples(algo: str) -> list[dict]:
    return [
        {**tree_sample(PARENT, TRAIN, seed=j, sample_id=str(j), vocab=2000), "algo": algo}
        for j in range(2)
    ]


def test_warmup_ramps_the_learning_rate_and_resumes_mid_ramp(tiny, tmp_path):
    """warmup_steps=6: optimizer steps k = 1..6 run at lr * k / 6, later ones at lr; a learner
    resumed from a checkpoint after 4 steps goes on at 5/6."""
    cfg = GRPOConfig(lr=1e-3, warmup_steps=6, epochs=2, minibatches=2, micro_batch_size=1)
    batch = _two_samples("grpo")
    learner = Learner.grpo(cfg, tiny)
    assert _lrs_of_one_step(learner, batch) == pytest.approx([1e-3 * k / 6 for k in (1, 2, 3, 4)])
    save_checkpoint(learner, tmp_path / "ckpt")
    resumed = load_checkpoint(tmp_path / "ckpt")
    assert _lrs_of_one_step(resumed, batch) == pytest.approx([1e-3 * 5 / 6, 1e-3, 1e-3, 1e-3])
    with pytest.raises(ConfigError, match="warmup_steps"):
        GRPOConfig(lr=1e-3, warmup_steps=-1)


def test_decay_lowers_the_learning_rate_linearly_to_zero_and_resumes(tiny, tmp_path):
    """decay_steps=5: optimizer steps k = 1..5 run at lr * (6 - k) / 5, later ones at 0 (the
    weights stop moving); a resumed learner goes on where it stopped; with warmup_steps=2 the
    two factors multiply."""
    cfg = SFTConfig(lr=1e-3, decay_steps=5, epochs=2, minibatches=2, micro_batch_size=1)
    batch = _two_samples("sft")
    learner = Learner.sft(cfg, tiny)
    assert _lrs_of_one_step(learner, batch) == pytest.approx([1e-3 * k / 5 for k in (5, 4, 3, 2)])
    save_checkpoint(learner, tmp_path / "ckpt")
    resumed = load_checkpoint(tmp_path / "ckpt")
    before = [p.detach().clone() for p in resumed.params()]
    assert _lrs_of_one_step(resumed, batch) == pytest.approx([1e-3 / 5, 0.0, 0.0, 0.0])
    assert any(not torch.equal(p, q) for p, q in zip(before, resumed.params(), strict=True))
    both = Learner.sft(
        SFTConfig(lr=1e-3, warmup_steps=2, decay_steps=4, epochs=2, minibatches=2), tiny
    )
    assert _lrs_of_one_step(both, batch) == pytest.approx([5e-4, 7.5e-4, 5e-4, 2.5e-4])
    with pytest.raises(ConfigError, match="decay_steps"):
        SFTConfig(lr=1e-3, decay_steps=-1)


def test_ppo_whitening_without_centring_keeps_every_advantages_sign(tiny):
    """whiten_center=False divides the advantages by their (floored) std only: in a batch whose
    advantages are all positive (a critic below every return, as when nearly all rollouts pass)
    none turns negative; the default subtracts the batch mean, as standard PPO does."""
    samples = []
    for k in range(2):
        s = tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000, returns=True)
        s["advantages"] = [
            abs(a) + 0.05 if t else 0.0 for a, t in zip(s["advantages"], TRAIN, strict=True)
        ]
        samples.append(s)
    A = torch.tensor([a for s in samples for a, t in zip(s["advantages"], TRAIN, strict=True) if t])
    q = torch.tensor(
        [w for s in samples for w, t in zip(s["loss_weights"], TRAIN, strict=True) if t]
    )
    mean, scale = losses.whiten(A, q, std_floor=0.1)
    cfg = dict(lr=1e-5, epochs=1, minibatches=1)
    centred = Learner.ppo(PPOConfig(**cfg), tiny).step(samples)
    assert centred["adv_whiten_mean"] == pytest.approx(mean) and mean > 0
    assert float((A - mean).min()) < 0  # centring turned some positive advantages negative
    scaled = Learner.ppo(PPOConfig(whiten_center=False, **cfg), tiny).step(samples)
    assert scaled["adv_whiten_mean"] == 0.0 and scaled["adv_whiten_std"] == pytest.approx(scale)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["head", "model"])
def test_critic_learns_and_round_trips_through_save(tiny, tmp_path, kind):
    """Value loss falls over steps; the saved critic/ reloads with the same values."""
    cfg = PPOConfig(lr=1e-4, critic_lr=1e-2, critic=kind, epochs=1, minibatches=1)
    learner = Learner.ppo(cfg, tiny)
    samples = [
        tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000, returns=True)
        for k in range(2)
    ]
    first = learner.step(samples)["value_loss"]
    for _ in range(8):
        last = learner.step(samples)["value_loss"]
    assert last < 0.5 * first
    vals = learner.values(samples)
    assert [len(v["values"]) for v in vals] == [len(PARENT)] * 2 and vals[0]["values"][0] == 0.0
    rec = save_policy(learner, tmp_path / "p")
    assert (tmp_path / "p" / "critic" / "value_head.safetensors").exists()
    assert set(load_file(str(tmp_path / "p" / "model.safetensors"))) == set(
        load_file(str(tiny / "model.safetensors"))
    )  # the policy dir holds only the policy weights
    again = Learner.ppo(PPOConfig(critic=kind), rec["path"])
    for a, b in zip(again.values(samples), vals, strict=True):
        assert a["sample_id"] == b["sample_id"] and a["values"] == pytest.approx(
            b["values"], abs=1e-6
        )
    with pytest.raises(ClawError, match="kind"):
        Learner.ppo(PPOConfig(critic="model" if kind == "head" else "head"), rec["path"])


def test_wrong_samples_are_rejected(tiny):
    """PPO needs returns; GRPO refuses PPO samples; bad trees name the field."""
    s = tree_sample([-1, 0, 1], [0, 1, 1], vocab=2000)
    with pytest.raises(ClawError, match="returns"):
        Learner.ppo(PPOConfig(), tiny).step([s])
    with pytest.raises(ClawError, match="ppo"):
        Learner.grpo(GRPOConfig(), tiny).step([dict(s, algo="ppo")])
    with pytest.raises(ClawError, match=r"samples\[0\].*parent\[2\]"):
        Learner.grpo(GRPOConfig(), tiny).step([dict(s, parent=[-1, 0, 2])])


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["weights", "token_mean", "constant"])
def test_kl_entropy_and_sequence_mis_paths(tiny, agg):
    """KL to the reference is 0 on step 1 and > 0 once the policy moved; once pi_old drifts from the
    engine's logprobs, sequence MIS drops paths; every option runs."""
    cfg = GRPOConfig(
        lr=1e-3,
        kl_coef=0.5,
        kl_estimator="k3",
        entropy_coef=0.01,
        is_correction="mis_sequence",
        loss_agg=agg,
        constant_len=8,
    )
    learner = Learner.grpo(cfg, tiny)
    s = tree_sample(PARENT, TRAIN, seed=2, vocab=learner.policy.config.vocab_size)
    s = dict(s, logprobs=learner.logprobs([s])[0])
    first = learner.step([s])
    second = learner.step([s])
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-9) and second["kl_ref"] > 0
    assert first["mismatch_max_abs"] < 1e-5 and first["is_weight_mean"] == 1.0
    assert (
        second["mismatch_max_abs"] > 1e-3
    )  # pi_old moved off the engine's logprobs after one step
    assert second["is_weight_mean"] < 1.0  # ... by more than the band: sequence MIS drops paths
    assert all(v is None or np.isfinite(v) for v in second.values() if isinstance(v, float))


def test_sft_learner_is_the_weighted_nll_at_temperature_one(tiny):
    """Learner.sft's loss is sum w (-log pi) / sum w at T = 1 whatever the recorded settings; it
    takes only sft samples, and the RL recipes refuse sft samples."""
    learner = Learner.sft(SFTConfig(lr=1e-3), tiny)
    w = [0.0, 0.0, 0.5, 0.1, 0.1, 0.1, 0.1, 0.0, 0.1]
    s = dict(tree_sample(PARENT, TRAIN, seed=4, weights=w), algo="sft")
    lp = learner.logprobs([s])[0]  # T = 1: the sample records no settings
    hot = dict(s, temperatures=[0.0 if k == 3 else 0.5 for k in range(len(PARENT))])
    assert learner.logprobs([hot])[0] == lp
    m = learner.step([hot])  # greedy and T = 0.5 tokens are still plain targets
    nll = sum(wi * -li for wi, li in zip(w, lp, strict=True)) / sum(w)
    assert m["loss"] == pytest.approx(nll, rel=1e-5) and m["clip_frac"] == 0.0
    assert "staleness_max" not in m and learner.step([s])["loss"] < m["loss"]
    with pytest.raises(ClawError, match="sft learner takes sft samples.*sft-samples"):
        learner.step([dict(s, algo="grpo")])
    with pytest.raises(ClawError, match="Learner.sft"):
        Learner.grpo(GRPOConfig(), tiny).step([s])


def test_a_micro_batch_without_trainable_tokens_adds_nothing(tiny):
    """A sample with no trainable token alone in its micro-batch: the step runs, and the loss and
    gradient are those of the other sample alone."""
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, micro_batch_size=1, minibatches=1)
    vocab = Learner.grpo(cfg, tiny).policy.config.vocab_size
    a = tree_sample([-1, 0, 1, 2], [0, 0, 1, 1], seed=1, vocab=vocab, sample_id="a")
    b = tree_sample([-1, 0, 1], [0, 0, 0], seed=2, vocab=vocab, sample_id="b")
    g_both, m_both = _grads_after_step(Learner.grpo(cfg, tiny), [a, b])
    g_a, m_a = _grads_after_step(Learner.grpo(cfg, tiny), [a])
    assert m_both["loss"] == pytest.approx(m_a["loss"], abs=1e-6)
    assert max(float((g_both[n] - g_a[n]).abs().max()) for n in g_a) < 1e-6
