"""The train, values and logprobs commands end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
from claw_rl.cli import main
from claw_rl.config import GRPOConfig, config_from_toml
from claw_rl.learner import Learner
from click.testing import CliRunner
from rl_testlib import tree_sample

PARENT = [-1, 0, 1, 2, 2, 4]
TRAIN = [0, 0, 1, 1, 1, 1]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _invoke(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


def test_train_writes_policies_metrics_config_and_resumes(tiny, tmp_path):
    """Two steps -> two policy lines on stdout; --resume continues the versions."""
    samples = _write(
        tmp_path / "s.jsonl",
        [tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000) for k in range(4)],
    )
    out = tmp_path / "run"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[grpo]\nlr = 1e-4\nname = "tiny"\nepochs = 2\n')
    r = _invoke(
        [
            "train",
            "--algo",
            "grpo",
            "--model",
            str(tiny),
            "--samples",
            str(samples),
            "--output",
            str(out),
            "--config",
            str(cfg),
            "--lr",
            "2e-4",
            "--batch-size",
            "2",
            "--is-correction",
            "mis_token",
        ]
    )
    assert r.exit_code == 0
    policies = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(p["name"], p["version"]) for p in policies] == [("tiny", 1), ("tiny", 2)]
    assert (
        policies[1]["path"].endswith("policy/v2")
        and (out / "policy" / "v2" / "model.safetensors").exists()
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert all("mismatch_kl_k3" in m["learner"] for m in metrics)
    resolved = config_from_toml(out / "config.toml", "grpo")
    assert GRPOConfig.from_dict(resolved) == GRPOConfig(
        lr=2e-4, name="tiny", epochs=2, is_correction="mis_token"
    )
    r = _invoke(
        [
            "train",
            "--algo",
            "grpo",
            "--resume",
            str(out),
            "--samples",
            str(samples),
            "--output",
            str(out),
        ]
    )
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [3]


def test_train_rejects_bad_input_naming_file_line_and_flags(tiny, tmp_path):
    """A malformed line is named by file:line; a PPO-only flag with --algo grpo is refused."""
    good = json.dumps(tree_sample(PARENT, TRAIN, vocab=2000))
    bad = _write(tmp_path / "bad.jsonl", [json.loads(good)])
    bad.write_text(good + "\n" + good.replace('"trainable": [0, 0', '"trainable": [1, 0') + "\n")
    r = CliRunner().invoke(
        main,
        [
            "train",
            "--algo",
            "grpo",
            "--model",
            str(tiny),
            "--samples",
            str(bad),
            "--output",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code != 0 and "bad.jsonl:2" in r.output and "root" in r.output
    r = CliRunner().invoke(
        main,
        [
            "train",
            "--algo",
            "grpo",
            "--model",
            str(tiny),
            "--samples",
            str(bad),
            "--output",
            str(tmp_path / "o"),
            "--vf-coef",
            "1.0",
        ],
    )
    assert r.exit_code != 0 and "--vf-coef does not apply to --algo grpo" in r.output
    r = CliRunner().invoke(
        main,
        [
            "train",
            "--algo",
            "grpo",
            "--model",
            str(tiny),
            "--samples",
            str(bad),
            "--output",
            str(tmp_path / "o"),
            "--is-cap",
            "0.5",
        ],
    )
    assert r.exit_code != 0 and "is_cap" in r.output


def test_values_then_ppo_train(tiny, tmp_path):
    """values -> (GAE elsewhere) -> train --algo ppo -> values from the trained critic."""
    rows = [
        tree_sample(PARENT, TRAIN, seed=k, sample_id=f"p{k}", vocab=2000, returns=True)
        for k in range(2)
    ]
    samples = _write(tmp_path / "s.jsonl", rows)
    r = _invoke(["values", "--model", str(tiny), "--samples", str(samples)])
    vals = [json.loads(x) for x in r.stdout.splitlines()]
    assert [v["sample_id"] for v in vals] == ["p0", "p1"] and vals[0]["values"] == [0.0] * len(
        PARENT
    )
    r = _invoke(
        [
            "train",
            "--algo",
            "ppo",
            "--model",
            str(tiny),
            "--samples",
            str(samples),
            "--output",
            str(tmp_path / "run"),
            "--critic-lr",
            "0.05",
        ]
    )
    path = json.loads(r.stdout)["path"]
    r = _invoke(["values", "--model", path, "--samples", str(samples)])
    vals = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(vals[1]["values"]) == len(PARENT) and any(v != 0.0 for v in vals[1]["values"])


def test_logprobs_reports_the_mismatch_per_call(tiny, tmp_path):
    """Calls whose logprobs came from the same model match; a tampered one is flagged."""
    learner = Learner.grpo(GRPOConfig(), tiny)
    prompt, completion = [5, 6, 7, 8], [40, 41, 42]
    from claw_rl.packing import chain_sample

    own = learner.logprobs([chain_sample("c", prompt, completion)])[0][len(prompt) :]
    base = {
        "schema": "claw.call/v1",
        "session": "s1",
        "prompt_ids": prompt,
        "completion_ids": completion,
    }
    calls = _write(
        tmp_path / "calls.jsonl",
        [
            {**base, "call_id": "c0", "seq": 0, "completion_logprobs": own},
            {**base, "call_id": "c1", "seq": 1, "completion_logprobs": [own[0] - 1.0, *own[1:]]},
            {
                **base,
                "call_id": "c2",
                "seq": 2,
                "trainable": False,
                "prompt_ids": [],
                "completion_ids": [],
                "completion_logprobs": [],
            },
        ],
    )
    r = CliRunner().invoke(main, ["logprobs", "--model", str(tiny), "--calls", str(calls)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["call_id"] for x in rows] == ["c0", "c1"]
    assert rows[0]["logprobs"] == pytest.approx(own, abs=1e-5)
    assert rows[0]["mismatch"]["mismatch_max_abs"] < 1e-5
    assert rows[1]["mismatch"]["mismatch_frac_beyond"] == pytest.approx(1 / 3)
    assert '"calls": 2' in r.stderr
    calls.write_text(json.dumps({**base, "call_id": "x", "completion_logprobs": [0.0]}) + "\n")
    r = CliRunner().invoke(main, ["logprobs", "--model", str(tiny), "--calls", str(calls)])
    assert r.exit_code != 0 and "calls.jsonl:1" in r.output


def test_follow_trains_a_published_batch_then_resumes_with_the_same_config(tiny, tmp_path):
    """`follow` trains step 0's published batch (the loop's fields in its row, the policy on
    stdout); rerun for 2 steps it resumes step 1 from the checkpoint, refuses a config flag the
    checkpoint disagrees with, and a wait that times out is written to steps/0001/learner-error;
    without --model a fresh run is a usage error."""
    from claw_rl import loop

    run = tmp_path / "run"
    loop.publish_batch(
        run, 0, [tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000) for k in range(2)],
        {"reward": 0.25},
    )  # fmt: skip
    args = ["follow", str(run), "--lr", "1e-3", "--wait-timeout", "0.2"]
    r = _invoke([*args, "--model", str(tiny), "--steps", "1"])
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [1]
    (row,) = loop.completed_steps(run)
    assert row["reward"] == 0.25 and row["learner"]["world_size"] == 1
    assert "lr = 0.001" in (run / "config.toml").read_text()
    r = _invoke(["follow", str(run), "--lr", "2e-3", "--steps", "2"])
    assert r.exit_code == 2 and "whose config differs in lr" in r.output, r.output
    assert "differs in lr" in (run / "steps" / "0001" / "learner-error").read_text()
    r = _invoke([*args, "--steps", "2"])
    assert r.exit_code == 1 and "no batch for step 1 after 0.2 s" in r.output, r.output
    assert "WaitTimeout" in (run / "steps" / "0001" / "learner-error").read_text()
    r = _invoke(["follow", str(tmp_path / "new"), "--steps", "1"])
    assert r.exit_code == 2 and "--model is required" in r.output, r.output


def test_follow_trains_with_the_loops_published_settings(tiny, tmp_path):
    """A new follower given no --config takes the learner settings the loop published with its
    first batch; a flag that disagrees with them is a usage error naming the loop's value."""
    from claw_rl import loop

    run = tmp_path / "run"
    loop.publish_batch(
        run, 0, [tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000) for k in range(2)],
        {"reward": 0.5}, {"lr": 3e-3, "epochs": 1, "max_staleness": 0, "drop_stale": True},
    )  # fmt: skip
    r = _invoke(["follow", str(run), "--model", str(tiny), "--steps", "1", "--lr", "1e-3"])
    assert r.exit_code == 2 and "the loop trains with lr = 0.003" in r.output, r.output
    r = _invoke(["follow", str(run), "--model", str(tiny), "--steps", "1", "--epochs", "1"])
    assert r.exit_code == 0, r.output
    config = (run / "config.toml").read_text()
    assert "lr = 0.003" in config and "epochs = 1" in config and "drop_stale = true" in config
