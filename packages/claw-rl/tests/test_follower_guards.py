"""What the follower trusts (issue 39 item 10): a batch marker must carry the samples' sha256,
learner settings are range-checked where a config is built, and a step whose loss, gradients or
weights turn non-finite fails loudly instead of saving NaN weights with exit 0."""

from __future__ import annotations

import json
import math

import pytest
import torch
from claw_rl import BatchError, ClawError, ConfigError, GRPOConfig, Learner, PPOConfig, loop
from claw_rl.cli import main
from click.testing import CliRunner
from rl_testlib import tree_sample

PARENT = [-1, 0, 1, 2, 2, 4]
TRAIN = [0, 0, 1, 1, 1, 1]


def _batch() -> list[dict]:
    return [tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000) for k in range(2)]


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_a_marker_without_sha256_is_refused_naming_the_file_and_field(tmp_path):
    """A batch.json whose sha256 is missing (or not a digest) is a BatchError naming the marker
    and the field, even when its sample count matches: no batch trains unchecked."""
    marker = loop.publish_batch(tmp_path, 0, _batch())
    body = json.loads(marker.read_text())
    for bad in ({k: v for k, v in body.items() if k != "sha256"}, {**body, "sha256": "abc"}):
        marker.write_text(json.dumps(bad) + "\n")
        with pytest.raises(BatchError, match=rf"{marker}: field 'sha256' .* is required"):
            loop.wait_batch(tmp_path, 0, 5)
    marker.write_text(json.dumps({k: v for k, v in body.items() if k != "samples"}) + "\n")
    with pytest.raises(BatchError, match=f"{marker}: field 'samples'"):
        loop.wait_batch(tmp_path, 0, 5)
    marker.write_text(json.dumps(body) + "\n")
    assert len(loop.wait_batch(tmp_path, 0, 5)[0]) == 2


def test_follow_refuses_a_marker_without_sha256(tiny, tmp_path):
    """`claw-rl follow` on a batch.json without sha256 exits 1 naming the file and the field,
    writes steps/0000/learner-error (the loop stops), and trains nothing."""
    run = tmp_path / "run"
    marker = loop.publish_batch(run, 0, _batch(), {}, {"lr": 1e-3})
    body = json.loads(marker.read_text())
    del body["sha256"]
    marker.write_text(json.dumps(body) + "\n")
    args = ["follow", str(run), "--model", str(tiny), "--steps", "1", "--config"]
    cfg = tmp_path / "c.toml"
    cfg.write_text("lr = 1e-3\n")
    r = _invoke([*args, str(cfg), "--wait-timeout", "1"])
    assert r.exit_code == 1, r.output
    assert str(marker) in r.output and "'sha256'" in r.output
    assert "sha256" in (run / "steps" / "0000" / "learner-error").read_text()
    assert not (run / "policy").exists() and loop.completed_steps(run) == []


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"lr": math.nan}, "lr"),
        ({"lr": 1e9}, "lr"),
        ({"lr": math.inf}, "lr"),
        ({"epochs": 1_000_000}, "epochs"),
        ({"epochs": 0}, "epochs"),
        ({"weight_decay": math.nan}, "weight_decay"),
        ({"lr": 0.5, "weight_decay": 3.0}, "weight_decay"),
        ({"adam_eps": 0.0}, "adam_eps"),
        ({"adam_beta2": 1.0}, "adam_beta2"),
        ({"max_grad_norm": math.nan}, "max_grad_norm"),
        ({"clip_eps_high": math.nan}, "clip_eps_high"),
        ({"clip_eps_low": 1.5}, "clip_eps_low"),
        ({"entropy_coef": -0.1}, "entropy_coef"),
        ({"kl_coef": math.nan}, "kl_coef"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"mis_seq_tol": math.inf}, "mis_seq_tol"),
        ({"is_cap": math.inf}, "is_cap"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"mismatch_threshold": math.nan}, "mismatch_threshold"),
    ],
)
def test_grpo_settings_out_of_range_are_refused_naming_the_field(kw, field):
    """NaN, infinite, huge or negative learner settings are a ConfigError naming the field."""
    with pytest.raises(ConfigError, match=rf"^{field} = "):
        GRPOConfig(**kw)
    with pytest.raises(ConfigError, match=rf"^flags: {field} = "):
        GRPOConfig.from_dict(kw, "flags")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"critic_lr": math.nan}, "critic_lr"),
        ({"critic_lr": 1e9}, "critic_lr"),
        ({"vf_coef": math.inf}, "vf_coef"),
        ({"value_clip": -0.2}, "value_clip"),
        ({"whiten_std_floor": math.nan}, "whiten_std_floor"),
    ],
)
def test_ppo_settings_out_of_range_are_refused_naming_the_field(kw, field):
    """PPO's critic settings are range-checked as the policy's are."""
    with pytest.raises(ConfigError, match=rf"^{field} = "):
        PPOConfig(**kw)


def test_the_bounds_themselves_are_accepted():
    """lr 10 (with adam_eps 1: the gradient-equivalence tests' setting), weight decay 1 / lr,
    1000 epochs and zero coefficients are in range."""
    cfg = GRPOConfig(lr=10.0, adam_eps=1.0, epochs=1000, weight_decay=0.1, kl_coef=0.0)
    assert (cfg.lr, cfg.epochs) == (10.0, 1000)
    assert PPOConfig(critic_lr=10.0, vf_coef=0.0, value_clip=0.0).critic_lr == 10.0


@pytest.mark.parametrize(
    ("learner", "field"),
    [({"lr": math.nan}, "lr"), ({"lr": 1e9}, "lr"), ({"epochs": 1001, "lr": 1e-3}, "epochs")],
)
def test_follow_refuses_published_settings_out_of_range(tiny, tmp_path, learner, field):
    """The loop's learner settings published in batch.json (lr NaN, lr 1e9, epochs past the
    bound of 1000; the issue's million would, unrefused, run for hours) are refused by a new
    follower, naming the marker and the field: exit 1, learner-error written, no policy
    trained."""
    run = tmp_path / "run"
    marker = loop.publish_batch(run, 0, _batch(), {}, learner)
    r = _invoke(["follow", str(run), "--model", str(tiny), "--steps", "1", "--wait-timeout", "1"])
    assert r.exit_code == 1, r.output
    assert str(marker) in r.output and f"{field} = " in r.output
    assert f"{field} = " in (run / "steps" / "0000" / "learner-error").read_text()
    assert not (run / "policy").exists() and loop.completed_steps(run) == []


def _params(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.params()]


def test_a_non_finite_gradient_is_refused_before_it_is_applied(tiny):
    """A NaN gradient (here injected by a hook on one weight) fails the step with a ClawError
    before AdamW runs: every weight and the optimizer state stay as they were."""
    learner = Learner.grpo(GRPOConfig(lr=1e-2), tiny)
    before = _params(learner)
    weight = learner.policy.get_output_embeddings().weight
    handle = weight.register_hook(lambda g: g * math.nan)
    with pytest.raises(ClawError, match="non-finite gradient"):
        learner.step(_batch())
    handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner), strict=True))
    assert not learner.optimizer.state and learner.dirty is False


def test_a_non_finite_loss_is_refused_even_with_finite_gradients(tiny):
    """A loss that is NaN while its gradients are finite (a NaN constant added to the objective)
    fails the step before anything is applied."""
    learner = Learner.grpo(GRPOConfig(lr=1e-2), tiny)
    objective = learner.objective

    def nan_objective(*args):
        loss, clipped = objective(*args)
        return loss + torch.tensor(math.nan), clipped

    learner.objective = nan_objective  # type: ignore[assignment]
    learner.objective.at_sampling_settings = True  # type: ignore[attr-defined]
    before = _params(learner)
    with pytest.raises(ClawError, match="non-finite loss"):
        learner.step(_batch())
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner), strict=True))


def test_non_finite_weights_fail_the_loop_step_and_nothing_is_saved(tiny, tmp_path):
    """An AdamW step that makes weights NaN (its lr set to NaN behind the config's back) fails
    train_step with a ClawError: no policy directory, checkpoint or row is written."""
    learner = Learner.grpo(GRPOConfig(lr=1e-2), tiny)
    for group in learner.optimizer.param_groups:
        group["lr"] = math.nan
    with pytest.raises(ClawError, match="non-finite weights"):
        loop.train_step(learner, _batch(), tmp_path, 0)
    assert not (tmp_path / "policy").exists() and not (tmp_path / "checkpoints").exists()
    assert loop.completed_steps(tmp_path) == []
