"""Smoke of bench/moe_long_run.py (the long MoE run, issue 40) at its smallest, and its k3.

The script on the tiny Qwen3-MoE fixture (random weights: its rollouts fail, so its steps have
no learning signal and no grad_norm): 2 steps with held-out Pass@1 after every step, then the
same run resumed to 5 steps in one chunk (held-out Pass@1 after 5); 1 held-out task, 1 training
task x 2 harnesses x 2 rollouts a step (~50 s in all).

    .venvs/workspace/bin/python -m pytest bench/test_moe_long_run.py -q -p no:cacheprovider
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "moe_long_run.py"
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-qwen3-moe"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run(out: Path, steps: int, every: int) -> subprocess.CompletedProcess:
    args = [sys.executable, str(SCRIPT), "--start", str(FIXTURE), "--out", str(out)]
    args += ["--steps", str(steps), "--eval-every", str(every), "--tasks-per-step", "1"]
    args += ["--rollouts", "2", "--eval-tasks", "1", "--eval-rollouts", "1"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_k3_expectation_is_the_exact_kl():
    """Over tokens drawn from p, E_p[k3] = KL(p || q) exactly: the weighted sum of k3 over a
    categorical's outcomes equals sum p log(p / q); each term is >= 0 and 0 where p = q."""
    import moe_long_run

    rng = random.Random(0)
    p = [rng.random() for _ in range(7)]
    q = [rng.random() for _ in range(7)]
    p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
    exact = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    terms = [moe_long_run.k3([math.log(b)], [math.log(a)]) for a, b in zip(p, q, strict=True)]
    assert sum(a * t for a, t in zip(p, terms, strict=True)) == pytest.approx(exact, rel=1e-12)
    assert min(terms) >= 0 and moe_long_run.k3([-1.5, -0.2], [-1.5, -0.2]) == 0.0


@pytest.mark.slow
def test_two_steps_with_eval_every_step_then_resumed(tmp_path):
    """2 steps, eval every step; then the same run with --steps 5 --eval-every 5: one chunk of
    3 steps after a resume (the third step after a resume once failed: the resumed learner took
    tokenizer files from a checkpoint the loop had deleted). Every step's row holds the MoE
    quantities, KL is cached (old steps not recomputed), held-out Pass@1 once after 0, 1, 2 and
    5 steps, the PNG."""
    out = tmp_path / "long"
    first = _run(out, 2, 1)
    assert first.returncode == 0, first.stderr[-3000:]
    kl_before = (out / "kl.jsonl").read_text()
    second = _run(out, 5, 5)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "KL to the start policy: steps 2..4 computed" in second.stderr
    assert (out / "kl.jsonl").read_text().startswith(kl_before)
    body = json.loads((out / "long_run.json").read_text())
    assert [r["step"] for r in body["steps"]] == [0, 1, 2, 3, 4]
    assert [e["steps"] for e in body["evals"]] == [0, 1, 2, 5]
    assert [e["steps"] for e in _rows(out / "eval.jsonl")] == [0, 1, 2, 5]  # none measured twice
    assert all(e["rollouts"] == 2 and 0 <= e["pass@1_mean"] <= 1 for e in body["evals"])
    for r in body["steps"]:
        assert set(r["reward_per_harness"]) == {"claw-agent-steps", "claw-agent-steps-anthropic"}
        assert r["entropy"] > 0 and r["mismatch_mean_abs"] >= 0
        assert 0 <= r["routing_flip_rate"] <= 1 and r["expert_load_max"] >= 1
        # the samples were drawn from the start policy itself: KL ~ 0 (fp noise), never < 0
        assert 0 <= r["kl_to_start_k3"] < 1e-6
    kl = _rows(out / "kl.jsonl")
    assert [k["step"] for k in kl] == [0, 1, 2, 3, 4] and all(k["tokens"] > 0 for k in kl)
    # the engine recorded routing and the step's samples carry it (what r3 replays)
    assert (out / "calls.routing").stat().st_size > 8
    assert "routing" in _rows(out / "steps" / "0000" / "samples.jsonl")[0]
    assert (out / "long_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the loop ran with the quickstart's options and routing replay
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["max_new_tokens"], cfg["adam_eps"], cfg["lr"], cfg["pack"]) == (
        48,
        1e-5,
        1.5e-4,
        "group",
    )
    assert cfg["routing_replay"] == "auto" and cfg["model"] == str(out.resolve() / "start-policy")
