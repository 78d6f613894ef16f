"""Per-step data handling of examples/mix_harness_rl.py is flat over a run (issue 19).

Run: .venvs/workspace/bin/python -m pytest bench/test_loop_per_step.py -s -p no:cacheprovider

A synthetic run directory whose calls.jsonl grows by one step's calls per step (8 rollouts of 3
calls each, prompts of ~300-400 tokens, as the proxy writes them). At step 2 and at step 200 it
times what the example does with a step's records before the learner: read this step's calls
(claw_rl.loop.step_records: from the byte offset where the step began, as the example does) and
build the step's trees. Next to
it, in the same run, the old way: re-read the whole calls.jsonl and keep the step's sessions.
Printed: seconds at both steps and the ratios (step 200 / step 2). Goal: the example's ratio is
1 within noise (asserted < 1.5); the old way grows with the run.
"""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path

import claw_tree
from claw_rl import loop


def step_calls(run: Path, step: int, sessions: set[str]) -> list:
    """The example's read of a step's calls: what was recorded since the step began."""
    text = loop.step_records(run, step, "calls.jsonl")
    records = claw_tree.read_calls(io.StringIO(text), skip_invalid=True).records
    return [c for c in records if c.session in sessions]


ROLLOUTS, CALLS, STEPS = 8, 3, 200


def _step_calls(step: int) -> list[dict]:
    """One step's records: ROLLOUTS sessions of CALLS calls, each prompt extending the last."""
    rng = random.Random(step)
    rows = []
    for r in range(ROLLOUTS):
        session = f"s{step}-r{r}"
        prompt = [rng.randrange(3, 4000) for _ in range(300)]
        for seq in range(CALLS):
            completion = [rng.randrange(3, 4000) for _ in range(24)]
            rows.append(
                {
                    "schema": "claw.call/v1",
                    "call_id": f"{session}-c{seq}",
                    "session": session,
                    "seq": seq,
                    "api": "openai.chat",
                    "model": "policy",
                    "policy": {"name": "policy", "version": step},
                    "trainable": True,
                    "prompt_ids": prompt,
                    "completion_ids": completion,
                    "completion_logprobs": [-1.0] * len(completion),
                    "finish_reason": "stop",
                    "started_at": float(seq),
                    "ended_at": float(seq) + 0.5,
                    "tags": {},
                }
            )
            prompt = prompt + completion + [rng.randrange(3, 4000) for _ in range(16)]
    return rows


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def test_per_step_data_handling_is_flat_over_the_run(tmp_path):
    """The example's per-step read of calls + trees takes the same time at step 200 as at step 2."""
    run = tmp_path / "run"
    (run / "steps").mkdir(parents=True)
    calls = run / "calls.jsonl"
    timed: dict[str, dict[int, float]] = {"offset": {}, "whole file": {}}
    with calls.open("a") as f:
        for step in range(STEPS + 1):
            (run / "steps" / f"{step:04d}").mkdir()
            f.writelines(json.dumps(c) + "\n" for c in _step_calls(step))
            f.flush()
            sessions = {f"s{step}-r{r}" for r in range(ROLLOUTS)}
            if step in (2, STEPS):
                mark = run / "steps" / f"{step:04d}" / "calls-offset.json"

                def new_way(step=step, sessions=sessions, mark=mark):
                    mark.unlink(missing_ok=True)  # each repeat reads as the step's first read
                    got = step_calls(run, step, sessions)
                    assert len(got) == ROLLOUTS * CALLS
                    claw_tree.build_forest(got)

                def old_way(sessions=sessions):
                    got = [
                        c
                        for c in claw_tree.read_calls(calls, skip_invalid=True).records
                        if c.session in sessions
                    ]
                    assert len(got) == ROLLOUTS * CALLS
                    claw_tree.build_forest(got)

                timed["offset"][step] = _best(new_way)
                timed["whole file"][step] = _best(old_way, repeat=2)
            else:  # the step reads its calls (it leaves the offset the next step starts from)
                step_calls(run, step, sessions)
    size = calls.stat().st_size
    print(f"\ncalls.jsonl at step {STEPS}: {size / 1e6:.1f} MB, {ROLLOUTS * CALLS} calls per step")
    ratios = {}
    for way, t in timed.items():
        ratios[way] = t[STEPS] / t[2]
        print(
            f"{way:>10}: step 2 {t[2] * 1e3:.1f} ms, step {STEPS} {t[STEPS] * 1e3:.1f} ms, "
            f"ratio {ratios[way]:.2f}"
        )
    assert ratios["offset"] < 1.5, ratios
    assert ratios["whole file"] > 10 * ratios["offset"], ratios  # the old way grows with the run
