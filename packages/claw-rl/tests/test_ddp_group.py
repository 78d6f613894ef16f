"""Group-packed batches under torchrun: one large group sample next to small ones, and a batch
whose only sample is a group (one rank owns nothing), give the 1-process update on 2 ranks,
replicated (DDP) or FSDP-sharded. Ranks own samples balanced by tokens (claw_rl._dist.assign)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rl_testlib import run_checked, torchrun_cmd
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "ddp_group_worker.py"


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_group_sample_on_two_ranks_matches_one_process(tiny, tmp_path, parallelism):
    """Weights after GRPO and PPO steps on group-packed batches agree to 1e-6 (1 vs 2 ranks)."""
    one, two = tmp_path / "one", tmp_path / "two"
    run_checked([sys.executable, str(WORKER), str(tiny), str(one)])
    run_checked(
        torchrun_cmd(
            2,
            str(WORKER),
            str(tiny),
            str(two),
            parallelism,
        )
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
