"""Asynchronous rollouts (--max-staleness 1) vs synchronous, steps per hour (issue 19).

Run: .venvs/workspace/bin/python -m pytest bench/test_async_rollouts.py -s -p no:cacheprovider

The schedule is claw_rl.loop.schedule, the one examples/mix_harness_rl.py's main loop runs;
the rollouts and the learner are stand-ins with the shape of a real run, at 1/250 time scale:
each step has 32 rollouts (every one at once, as an inference engine batches them), a rollout
is 8 model calls one after the other, a call takes a lognormal time with median 1 s and
p99/p50 = 10 (sigma = ln 10 / 2.326; agent calls mix short answers with long tool-using
generations), and the update takes 6 s. The engine is assumed not to be the bottleneck: a call
takes as long whether one step's rollouts or two are in flight (with S = 1 up to twice the
rollouts run at once). Same seed, same calls, same number of samples in both modes; the ratio
of steps per hour is printed, goal >= 1.8. The schedule launches whole steps, so a step still
waits for its own slowest rollout (S = 1 overlaps it with the next step's rollouts and the
update): the ideal is 2x here, and the step-to-step spread of the slowest rollout costs the
rest (measured 1.79x and 1.81x on a loaded 2-core machine; asserted: >= 1.6, as a floor).
"""

from __future__ import annotations

import concurrent.futures
import math
import random
import time

import claw_rl.loop

SCALE = 4e-3  # 1 s of the modelled run = 4 ms here
ROLLOUTS, CALLS, STEPS = 32, 8, 24
MEDIAN_S, P99_OVER_P50, TRAIN_S = 1.0, 10.0, 6.0
SIGMA = math.log(P99_OVER_P50) / 2.326


def _latencies(step: int) -> list[list[float]]:
    """Per rollout, its calls' latencies (seconds of the modelled run), seeded by the step."""
    rng = random.Random(step)
    return [
        [MEDIAN_S * math.exp(rng.gauss(0.0, SIGMA)) for _ in range(CALLS)] for _ in range(ROLLOUTS)
    ]


def _rollout(calls: list[float]) -> dict:
    for seconds in calls:
        time.sleep(seconds * SCALE)
    return {"calls": len(calls)}


def _run(max_staleness: int) -> tuple[float, list[int]]:
    """Wall seconds for STEPS steps of the loop, and the staleness of each trained step."""
    engine = concurrent.futures.ThreadPoolExecutor(max_workers=ROLLOUTS * (max_staleness + 1))
    steps = concurrent.futures.ThreadPoolExecutor(max_workers=max_staleness + 1)
    version, launched_at = 0, {}

    def launch(k: int) -> concurrent.futures.Future:
        launched_at[k] = version  # the policy in force when step k's rollouts start

        def step_rollouts() -> list[dict]:
            futures = [engine.submit(_rollout, calls) for calls in _latencies(k)]
            return [f.result() for f in futures]

        return steps.submit(step_rollouts)

    staleness = []
    t0 = time.perf_counter()
    for step, _, outcomes, _ in claw_rl.loop.schedule(range(STEPS), max_staleness, launch):
        assert len(outcomes) == ROLLOUTS
        staleness.append(version - launched_at[step])
        time.sleep(TRAIN_S * SCALE)  # the update
        version += 1
    seconds = time.perf_counter() - t0
    engine.shutdown()
    steps.shutdown()
    return seconds, staleness


def test_async_s1_vs_sync_steps_per_hour():
    """--max-staleness 1 runs more steps per hour than the synchronous loop on long-tailed
    rollouts (goal 1.8x, floor 1.6x), and no step trains on rollouts started more than one
    version back."""
    sync, stale0 = _run(0)
    asyn, stale1 = _run(1)
    per_hour = {name: STEPS / (t / SCALE) * 3600 for name, t in (("sync", sync), ("async", asyn))}
    ratio = per_hour["async"] / per_hour["sync"]
    calls = [c for k in range(STEPS) for r in _latencies(k) for c in r]
    calls.sort()
    p50, p99 = calls[len(calls) // 2], calls[int(len(calls) * 0.99)]
    print(
        f"\ncall latency p50 {p50:.2f} s, p99 {p99:.2f} s (p99/p50 {p99 / p50:.1f}); "
        f"{ROLLOUTS} rollouts x {CALLS} calls per step, update {TRAIN_S} s"
    )
    print(
        f"steps/hour (modelled time): sync {per_hour['sync']:.1f}, async S=1 "
        f"{per_hour['async']:.1f}, ratio {ratio:.2f}; staleness sync {max(stale0)}, "
        f"async {max(stale1)}"
    )
    print(f"goal >= 1.8: {'met' if ratio >= 1.8 else 'NOT met'}")
    assert max(stale0) == 0 and max(stale1) == 1
    assert ratio >= 1.6, ratio  # regression floor; measured 1.79-1.8x (see the report)
