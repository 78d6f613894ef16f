"""examples/mix_harness_rl.py --learner follow: its learner is `claw-rl follow` run as a two-node
torchrun job (gloo on CPU, both "nodes" on this machine), which meets the loop only through the
run directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "examples" / "mix_harness_rl.py"
CLAW_RL = Path(sys.executable).with_name("claw-rl")
DIGEST = re.compile(r"claw-rl follow: rank (\d)/(\d): weights sha256 ([0-9a-f]{64})")


def _rows(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(node: int, port: int, learner: list[str], tmp: Path) -> subprocess.Popen:
    """One torchrun agent of the two-node job: a node of its own (its own temp directory), the
    rendezvous store hosted by node 0 (c10d numbers the ranks as the nodes join; torchrun says
    it ignores --node-rank there, which a static rendezvous would use)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
           "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"follow-{port}",
           "--rdzv-conf", f"is_host={int(node == 0)}", str(CLAW_RL), *learner]  # fmt: skip
    (temp := tmp / f"node{node}").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temp)}
    with (tmp / f"node{node}.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(
            cmd, cwd=temp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def test_ppo_with_a_follower_is_refused_before_anything_runs(tmp_path):
    """PPO's GAE needs its critic's values before the samples are written: --algo ppo
    --learner follow stops with a clear error and creates no run directory."""
    run = tmp_path / "r"
    r = subprocess.run(
        [sys.executable, str(LOOP), "--run-dir", str(run), "--algo", "ppo", "--learner", "follow"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2 and "--learner follow is GRPO's" in r.stderr, r.stderr[-2000:]
    assert not run.exists()


@pytest.mark.slow
def test_loop_trains_through_a_two_node_torchrun_follower(tmp_path):
    """Two GRPO steps with --learner follow while `claw-rl follow` runs under torchrun --nnodes 2:
    the follower writes policies v1 and v2 and the metrics rows, which carry the loop's fields
    and the learner's world size 2; every call of step 2 is served by v1, and both ranks end
    with the same weights (the sha256 each logs). The follower is given no learner settings: it
    takes the loop's, published with the first batch."""
    from claw_rl import TinySpec, init_tiny

    model, run = tmp_path / "model", tmp_path / "run"
    init_tiny(model, TinySpec())  # the loop's own default start, made first for the follower
    learner = [
        "follow",
        str(run),
        "--model",
        str(model),
        "--steps",
        "2",
        "--wait-timeout",
        "600",
        "--weights-digest",
    ]  # fmt: skip
    port = _free_port()
    nodes = [_start_node(k, port, learner, tmp_path) for k in (0, 1)]
    try:
        r = subprocess.run(
            [sys.executable, str(LOOP), "--run-dir", str(run), "--model", str(model),
             "--steps", "2", "--rollouts", "2", "--task", "toy-digits", "--learner", "follow",
             "--learner-timeout", "600", "--lr", "5e-3"],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        logs = [(tmp_path / f"node{k}.log").read_text for k in (0, 1)]
        assert r.returncode == 0, r.stderr[-3000:] + "".join(f() for f in logs)[-3000:]
        assert [n.wait(timeout=300) for n in nodes] == [0, 0], "".join(f() for f in logs)[-3000:]
    finally:
        for n in nodes:
            if n.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(n.pid, signal.SIGKILL)
                n.wait()
    assert "waiting for claw-rl follow" in r.stderr
    # the follower, given no learner options, trained with the loop's (batch.json's "learner")
    config = tomllib.loads((run / "config.toml").read_text())["grpo"]
    assert (config["lr"], config["epochs"], config["max_staleness"]) == (5e-3, 2, 0)
    assert config["drop_stale"] is True
    assert [p["version"] for p in _rows(run / "policies.jsonl")] == [1, 2]
    rows = _rows(run / "metrics.jsonl")
    assert [(m["step"], m["policy_version"]) for m in rows] == [(0, 1), (1, 2)]
    for m in rows:
        assert m["rollouts"] == 4 and "reward" in m and "pass@1" in m and "staleness" in m
        assert m["learner"]["world_size"] == 2 and "train_s" in m["time"] and "data_s" in m["time"]
    calls = _rows(run / "calls.jsonl")
    sessions = {o["session"] for o in _rows(run / "steps" / "0001" / "outcomes.jsonl")}
    assert len(sessions) == 4
    assert {c["policy"]["version"] for c in calls if c["session"] in sessions} == {1}
    digests = {}
    for k in (0, 1):
        for rank, world, digest in DIGEST.findall((tmp_path / f"node{k}.log").read_text()):
            digests[int(rank)] = (int(world), digest)
    assert sorted(digests) == [0, 1] and len(set(digests.values())) == 1, digests
    assert digests[0][0] == 2
