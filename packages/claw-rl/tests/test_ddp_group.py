"""Group-packed batches under torchrun: one large group sample next to small ones, and a batch
whose only sample is a group (one rank owns nothing), give the 1-process update on 2 ranks,
replicated (DDP) or FSDP-sharded. Ranks own samples balanced by tokens (claw_rl._dist.assign)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "ddp_group_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_group_sample_on_two_ranks_matches_one_process(tiny, tmp_path, parallelism):
    """Weights after GRPO and PPO steps on group-packed batches agree to 1e-6 (1 vs 2 ranks)."""
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, str(WORKER), str(tiny), str(one)])
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(WORKER),
            str(tiny),
            str(two),
            parallelism,
        ]
    )
    base = load_file(str(tiny / "model.safetensors"))
    for algo in ("grpo", "ppo"):
        assert (two / f"{algo}-loss").read_text().split()[0] == "2"
        a = load_file(str(one / algo / "model.safetensors"))
        b = load_file(str(two / algo / "model.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] - b[k]).abs().max() < 1e-6, (algo, k)
        assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-4  # it moved
        loss_one = float((one / f"{algo}-loss").read_text().split()[1])
        assert loss_one == pytest.approx(
            float((two / f"{algo}-loss").read_text().split()[1]), abs=1e-6
        )
