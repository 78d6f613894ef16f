"""claw-bench: planning and scoring throughput, against JSON encoding / parsing of the same records.

Run: .venvs/claw-bench/bin/python -m pytest bench/test_bench_pipeline.py --benchmark-only
"""

from __future__ import annotations

import json

import pytest
from claw_bench import load_harness, load_suite, plan_jobs, score_runs

SUITE = load_suite("claw-mini")
HARNESSES = [load_harness(h) for h in ("claw-agent-chat", "openclaw-chat", "claude-code")]


def _plan():
    return plan_jobs(
        list(SUITE.tasks),
        HARNESSES,
        samples=8,
        proxy_url="http://127.0.0.1:8000",
        secret=b"k",
        run_id="b",
    )


JOBS = _plan()
RUNS = [
    {
        "schema": "claw.run/v1",
        "job_id": j["job_id"],
        "status": "ok",
        "exit_code": 0,
        "started_at": 0.0,
        "ended_at": 1.0,
        "meta": j["meta"],
        "collected": {".claw_verify/reward.json": '{"a": 1.0, "b": 0.0}'},
        "verify": {
            "exit_code": 1,
            "passed": False,
            "reward": 0.5,
            "details": {"a": 1.0, "b": 0.0},
            "output": "FAIL b\n",
        },
    }
    for j in JOBS
]
RUN_LINES = [json.dumps(r) for r in RUNS]


@pytest.mark.benchmark(group="plan claw-mini x 3 harnesses x 8 samples")
def test_plan_jobs(benchmark):
    """Planning: render adapters, mint tokens, build job dicts."""
    jobs = benchmark(_plan)
    assert len(jobs) == len(SUITE.tasks) * 3 * 8


@pytest.mark.benchmark(group="plan claw-mini x 3 harnesses x 8 samples")
def test_plan_serialise_baseline(benchmark):
    """Baseline: only JSON-encoding the planned jobs."""
    benchmark(lambda: [json.dumps(j) for j in JOBS])


@pytest.mark.benchmark(group="score claw-mini x 3 x 8 runs")
def test_score_runs(benchmark):
    """Scoring parsed runs into outcomes."""
    outs = benchmark(score_runs, RUNS)
    assert len(outs) == len(RUNS)


@pytest.mark.benchmark(group="score claw-mini x 3 x 8 runs")
def test_parse_runs_baseline(benchmark):
    """Baseline: only JSON-decoding the same run lines."""
    benchmark(lambda: [json.loads(x) for x in RUN_LINES])
