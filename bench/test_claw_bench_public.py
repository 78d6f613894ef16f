"""claw-bench public-suite loaders: load speed and the verify runner's overhead, each against a baseline.

Run: .venvs/claw-bench/bin/python -m pytest bench/test_claw_bench_public.py --benchmark-only \
        --benchmark-group-by=group --benchmark-columns=mean,stddev,rounds

- load: a 200-task ClawGym JSONL into Tasks (validation, remap, runner files) vs plain json.loads of
  its lines (the floor any loader pays).
- verify: the runner (copy reward/, remap the mount dir, run reward.sh under a process-group
  timeout, parse, write reward + details) vs running the same reward.sh directly in a workspace
  where reward/ is already in place and the mount dir already right.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from claw_bench.check import write_files
from claw_bench.loaders import load_clawgym_jsonl, load_public

FIXTURES = (
    Path(__file__).resolve().parents[1]
    / "packages"
    / "claw-bench"
    / "tests"
    / "fixtures"
    / "public"
)
TASK = FIXTURES / "clawgym" / "cg-csv-totals"


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> Path:
    src = [
        json.loads(ln)
        for ln in (FIXTURES / "clawgym" / "clawgym_tasks.jsonl").read_text().splitlines()
        if ln
    ]
    path = tmp_path_factory.mktemp("load") / "tasks.jsonl"
    rows = [dict(src[i % 2], task_id=f"t{i:04d}") for i in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.benchmark(group="load 200 ClawGym JSONL tasks")
def test_load_jsonl_baseline_json(benchmark, jsonl):
    rows = benchmark(lambda: [json.loads(ln) for ln in jsonl.read_text().splitlines()])
    assert len(rows) == 200


@pytest.mark.benchmark(group="load 200 ClawGym JSONL tasks")
def test_load_jsonl_loader(benchmark, jsonl):
    tasks = benchmark(load_clawgym_jsonl, jsonl)
    assert len(tasks) == 200


def _workspace(tmp: Path, name: str) -> Path:
    ws = tmp / name
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir()
    write_files(ws, load_public(TASK)[0].workspace)
    return ws


@pytest.mark.benchmark(group="verify one ClawGym task")
def test_verify_baseline_reward_sh(benchmark, tmp_path):
    ws = _workspace(tmp_path, "direct")
    shutil.copytree(TASK / "reward", ws / "reward")
    sh = ws / "reward" / "reward.sh"
    sh.write_text(sh.read_text().replace("/root/.openclaw/workspace", str(ws)))
    out = benchmark(
        lambda: (
            subprocess.run(
                ["bash", "reward/reward.sh"], cwd=ws, capture_output=True, text=True
            ).stdout
        )
    )
    assert out.splitlines()[-1] == "0.0"


@pytest.mark.benchmark(group="verify one ClawGym task")
def test_verify_runner(benchmark, tmp_path):
    task = load_public(TASK)[0]
    ws = _workspace(tmp_path, "runner")
    write_files(ws, task.verify_files())

    def verify() -> str:
        subprocess.run(
            ["bash", "-c", task.verify_command()], cwd=ws, capture_output=True, text=True
        )
        return (ws / task.reward_file).read_text()

    assert float(benchmark(verify)) == 0.0
