"""Data parallel under torchrun: 2 CPU processes (gloo) give the same update as 1 process on the
same global batch (GRPO with minibatches, PPO with a value head)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "ddp_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_match_one(tiny, tmp_path):
    """Weights after one GRPO and one PPO step agree to 1e-6 between world size 1 and 2."""
    _run([sys.executable, str(WORKER), str(tiny), str(tmp_path / "one")])
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER), str(tiny),
          str(tmp_path / "two")])
    assert (tmp_path / "two" / "world").read_text().split()[0] == "2"
    for algo in ("grpo", "ppo"):
        for f in ("model.safetensors", *(["critic/value_head.safetensors"] if algo == "ppo" else [])):
            a = load_file(str(tmp_path / "one" / algo / f))
            b = load_file(str(tmp_path / "two" / algo / f))
            base = load_file(str(tiny / f)) if f == "model.safetensors" else None
            for k in a:
                assert (a[k] - b[k]).abs().max() < 1e-6, (algo, k)
            if base is not None:  # and the update is not trivially zero
                assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-4
    one = float((tmp_path / "one" / "world").read_text().split()[1])
    two = float((tmp_path / "two" / "world").read_text().split()[1])
    assert one == pytest.approx(two, abs=1e-6)


@pytest.mark.slow
def test_train_cli_under_torchrun(tiny, tmp_path):
    """`torchrun -m claw_rl.cli train` with 2 ranks writes one policy equal to the 1-process one."""
    import json

    from conftest import tree_sample

    rows = [tree_sample([-1, 0, 1, 2, 2, 4], [0, 0, 1, 1, 1, 1], seed=k, sample_id=str(k), vocab=2000)
            for k in range(3)]
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", "--algo", "grpo", "--model", str(tiny), "--samples", str(samples), "--lr", "1e-3",
            "--micro-batch-size", "1"]
    _run([sys.executable, "-m", "claw_rl.cli", *args, "--out", str(tmp_path / "one")])
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "claw_rl.cli", *args,
          "--out", str(tmp_path / "two")])
    assert len((tmp_path / "two" / "policies.jsonl").read_text().splitlines()) == 1
    a = load_file(str(tmp_path / "one" / "policy" / "v1" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "policy" / "v1" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
