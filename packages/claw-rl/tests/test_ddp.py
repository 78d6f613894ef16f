"""Data parallel under torchrun: 2 CPU processes (gloo) give the same update as 1 process on the
same global batch (GRPO with minibatches, PPO with a value head), model replicated or FSDP-sharded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rl_testlib import run_checked, torchrun_cmd
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "ddp_worker.py"


@pytest.fixture(scope="module")
def one_process(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run_checked([sys.executable, str(WORKER), str(tiny), str(out)])
    return out


SAVED = {
    "grpo": ["model.safetensors"],
    "ppo": ["model.safetensors", "critic/value_head.safetensors"],
    "ppo-critic-model": [
        "model.safetensors",
        "critic/model.safetensors",
        "critic/value_head.safetensors",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_processes_match_one(tiny, tmp_path, one_process, parallelism):
    """Weights after GRPO (KL reference, checkpoint + resume between two steps) and PPO (value
    head; separate critic model) agree to 2e-6 between 1 process and 2, replicated or FSDP.

    What may differ is float32 rounding: the order of the gradient sums (two ranks' partial sums
    against one process's sequence) and which samples share a micro-batch (ranks re-balance each
    minibatch by tokens): a few ulps at |w| <= ~1 (1 ulp = 1.19e-7). The workers run AdamW with
    eps 1 and lr 1, so an update is ~ lr * gradient (max 0.17) and a gradient's rounding gap
    stays its size; at eps 1e-8 Adam's second step divided one near-cancelling PPO element by its
    tiny sqrt(v) and grew its gap to 1.06e-6 here and 7.8e-6 under another thread count's kernels.
    Measured max 1.53e-7 (1 vs 2 processes, ddp and fsdp, 1 and 2 threads). The clip coefficient
    is order-free (float64 norms, see ``_dist._sq_norm``)."""
    two = tmp_path / "two"
    run_checked(
        torchrun_cmd(
            2,
            str(WORKER),
            str(tiny),
            str(two),
            parallelism,
        )
    )
    assert (two / "world").read_text().split()[0] == "2"
    for run, files in SAVED.items():
        for f in files:
            a = load_file(str(one_process / run / f))
            b = load_file(str(two / run / f))
            assert a.keys() == b.keys(), (run, f)
            for k in a:
                assert (a[k] - b[k]).abs().max() < 2e-6, (run, f, k)
            if f == "model.safetensors":  # and the update is not trivially zero
                base = load_file(str(tiny / f))
                assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-4
    held = [[int(x) for x in (two / f"params-rank{r}").read_text().split()] for r in (0, 1)]
    total = held[0][1]
    if parallelism == "fsdp":  # each rank holds its shard of the parameters, together all of them
        assert held[0][0] + held[1][0] == total and max(held[0][0], held[1][0]) < 0.6 * total
    else:
        assert held[0][0] == held[1][0] == total
    config = json.loads((two / "grpo" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]  # loadable: not the FSDP wrapper's name
    one = float((one_process / "world").read_text().split()[1])
    assert one == pytest.approx(float((two / "world").read_text().split()[1]), abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_train_cli_under_torchrun(tiny, tmp_path, parallelism):
    """`torchrun -m claw_rl.cli train` with 2 ranks writes one policy equal to the 1-process one."""
    from rl_testlib import tree_sample

    rows = [
        tree_sample([-1, 0, 1, 2, 2, 4], [0, 0, 1, 1, 1, 1], seed=k, sample_id=str(k), vocab=2000)
        for k in range(3)
    ]
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "train",
        "--algo",
        "grpo",
        "--model",
        str(tiny),
        "--samples",
        str(samples),
        "--lr",
        "1",
        "--adam-eps",
        "1",  # the update is ~ lr * gradient: no element's rounding gap grows (see above)
        "--micro-batch-size",
        "1",
    ]
    run_checked([sys.executable, "-m", "claw_rl.cli", *args, "--output", str(tmp_path / "one")])
    run_checked(
        torchrun_cmd(
            2,
            "-m",
            "claw_rl.cli",
            *args,
            "--parallelism",
            parallelism,
            "--output",
            str(tmp_path / "two"),
        )
    )
    assert len((tmp_path / "two" / "policies.jsonl").read_text().splitlines()) == 1
    a = load_file(str(tmp_path / "one" / "policy" / "v1" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "policy" / "v1" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
