"""A real harness in the RL loop (issue 17): mini-swe-agent in two GRPO steps of the example.

examples/mix_harness_rl.py runs as a user would run it (a subprocess of the workspace Python)
with `--harness claw-agent-text --harness mini-swe-agent` on claw-toy's toy-digits, 2 steps of
2 rollouts per harness, on a new tiny random policy. The random policy never writes a bash tool
call, so mini-swe-agent answers each call with its format-error message and calls again, up to
its limit of 3 consecutive format errors (mini.yaml's max_consecutive_format_errors). mini drops
the unparseable answer from its history, so the calls of a session are siblings that share the
whole system + task prompt: their tree stores that prefix once. GRPO groups by task over both
harnesses, so mini's rollouts (reward 0: no answer.txt) get a non-zero advantage against the
reference agent's dense reward, and their tokens move the update.

Measured (2 loaded cores, seed 0): 3 calls per mini session, mini's tree ratio flat/tree 2.77
per step (the step's 2.67 with the reference agent's one-call trees), 4 samples, 4174 tree
tokens, 128 trained tokens per step (96 of them mini's); the run takes 35-75 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import claw_tree
import pytest
from _pipeline import CASES, TOOLS_BIN, missing_pieces
from _servers import ROOT

HARNESS, REFERENCE, TASK = "mini-swe-agent", "claw-agent-text", "toy-digits"
STEPS, ROLLOUTS = 2, 2


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_mini_swe_agent_sessions_train_in_two_rl_steps(tmp_path):
    """mini-swe-agent's multi-call sessions share prompt prefixes in the step's trees (flat/tree
    > 1), every one of their completion tokens is a trainable token of the step's samples, and
    step 1's calls are answered by the policy step 0 produced."""
    why = missing_pieces(next(c for c in CASES if c.name == HARNESS))
    if why:
        pytest.skip(why)
    run = tmp_path / "run"
    ro = os.pathsep.join(p for p in (os.environ.get("CLAW_SANDBOX_RO_PATHS"), str(ROOT)) if p)
    env = dict(
        os.environ,
        PATH=f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        # the harness lives in the checkout: keep it visible in bwrap wherever it is cloned
        CLAW_SANDBOX_RO_PATHS=ro,
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    argv = [
        sys.executable,
        str(ROOT / "examples" / "mix_harness_rl.py"),
        "--run-dir",
        str(run),
        "--harness",
        REFERENCE,
        "--harness",
        HARNESS,
        "--task",
        TASK,
        "--steps",
        str(STEPS),
        "--rollouts",
        str(ROLLOUTS),
        "--max-new-tokens",
        "16",
        "--parallel",
        "2",
        "--seed",
        "0",
    ]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    calls = _rows(run / "calls.jsonl")
    metrics = _rows(run / "metrics.jsonl")
    policies = _rows(run / "policies.jsonl")
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert [p["version"] for p in policies] == [m["policy_version"] for m in metrics] == [1, 2]
    v1, v2 = (Path(p["path"]) / "model.safetensors" for p in policies)
    assert v1.read_bytes() != v2.read_bytes(), "step 1 changed no weight"

    for step, row in enumerate(metrics):
        d = run / "steps" / f"{step:04d}"
        outcomes = [o for o in _rows(d / "outcomes.jsonl") if o["harness"] == HARNESS]
        assert len(outcomes) == ROLLOUTS and all(o["status"] == "ok" for o in outcomes), outcomes
        sessions = {o["session"] for o in outcomes}
        mine = [c for c in calls if c["session"] in sessions]
        per_session = {s: sum(c["session"] == s for c in mine) for s in sessions}
        assert all(n >= 2 for n in per_session.values()), per_session
        # the calls of step k are answered by the policy in force: version k
        assert {c["policy"]["version"] for c in mine} == {step}, step

        # mini's sessions alone: flat tokens / tree tokens > 1 (the shared prompt stored once)
        forest = claw_tree.build_forest([claw_tree.Call.from_dict(c) for c in mine])
        assert claw_tree.forest_stats(forest)["dedup_factor"] > 1.2, per_session
        assert row["dedup_factor"] > 1.2 and row["dropped_stale"] == 0, row

        # every completion token of mini's calls is a trainable token of the step's samples,
        # with a non-zero advantage (grouped by task with the reference agent's dense reward)
        samples = _rows(d / "samples.jsonl")
        ours = [s for s in samples if set(s["sessions"]) & sessions]
        assert ours and all(set(s["sessions"]) <= sessions for s in ours)
        trained = [
            (tok, adv)
            for s in ours
            for tok, t, adv in zip(s["input_ids"], s["trainable"], s["advantages"], strict=True)
            if t
        ]
        completions = sorted(t for c in mine for t in c["completion_ids"])
        assert sorted(tok for tok, _ in trained) == completions
        assert all(adv != 0 for _, adv in trained)
        # the learner trained on exactly these samples
        learner = row["learner"]
        assert learner["samples"] == len(samples)
        assert learner["trainable_tokens"] == sum(sum(s["trainable"]) for s in samples)
