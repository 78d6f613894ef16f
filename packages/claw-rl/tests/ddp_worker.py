"""Worker for test_ddp.py: GRPO (with a KL reference) and PPO (value head, and a separate critic
model) updates on a fixed global batch, a checkpoint and resume in between, a batch without
learning signal (the ranks skip the policy update together: weights bit-identical), then save.

Run as ``python ddp_worker.py MODEL OUT`` (1 process) or under
``torchrun --nproc_per_node 2 ddp_worker.py MODEL OUT [ddp|fsdp]`` (gloo on CPU).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from claw_rl import (  # noqa: E402
    ClawError,
    GRPOConfig,
    Learner,
    PPOConfig,
    load_checkpoint,
    save_checkpoint,
    save_policy,
)
from claw_rl._dist import init_from_env, is_sharded, shutdown  # noqa: E402
from rl_testlib import tree_sample  # noqa: E402

PARENT = [-1, 0, 1, 2, 2, 4, 3, 1, 7]
# AdamW with eps 1: an update is ~ lr * gradient, so the 1-vs-2-process gap in the weights is the
# float32 gap in the gradient sums; at eps 1e-8 Adam divides by sqrt(v) and a near-cancelling
# element's rounding gap grows to 1e-6-1e-5, by an amount that differs between CPUs' kernels
OPT = {"lr": 1.0, "adam_eps": 1.0}
TRAIN = [0, 0, 1, 1, 1, 1, 1, 0, 1]


def _local_weights(module) -> list:
    """This rank's copy of every parameter (its shard under FSDP)."""
    return [(p.to_local() if is_sharded(p) else p).detach().clone() for p in module.parameters()]


def _changed(a: list, b: list) -> list[int]:
    return [k for k, (x, y) in enumerate(zip(a, b, strict=True)) if not x.equal(y)]


def main(model: str, out: str, parallelism: str = "ddp") -> None:
    rank, world = init_from_env("gloo")
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    # 5 samples, 1 per micro-batch, 2 minibatches: ranks own unequal shares (FSDP pads)
    rows = [
        tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000, returns=True)
        for k in range(5)
    ]
    grpo_rows = [{**{k: v for k, v in r.items() if k != "returns"}, "algo": "grpo"} for r in rows]
    g = Learner.grpo(
        GRPOConfig(
            **OPT,
            epochs=2,
            minibatches=2,
            micro_batch_size=1,
            loss_agg="token_mean",
            kl_coef=0.1,
            parallelism=parallelism,
        ),
        model,
    )
    g.step(grpo_rows)
    held = sum(p.to_local().numel() if is_sharded(p) else p.numel() for p in g.policy.parameters())
    (o / f"params-rank{rank}").write_text(
        f"{held} {sum(p.numel() for p in g.policy.parameters())}\n"
    )
    save_checkpoint(g, o / "grpo-ckpt")
    g = load_checkpoint(o / "grpo-ckpt")
    g.step(grpo_rows[::-1])
    # no signal (every advantage 0): the ranks skip the update together, weights bit-identical
    before = _local_weights(g.policy)
    zero = [{**r, "advantages": [0.0] * len(PARENT)} for r in grpo_rows]
    assert g.step(zero)["policy_updates"] == 0
    assert _changed(before, _local_weights(g.policy)) == []
    assert save_policy(g, o / "grpo")["version"] == 1
    p = Learner.ppo(
        PPOConfig(**OPT, critic_lr=1.0, micro_batch_size=2, parallelism=parallelism), model
    )
    m = p.step(rows)
    # no policy signal (equal advantages, whitened to 0): only the value head steps
    before = _local_weights(p.policy)
    same = [{**r, "advantages": [0.5 * t for t in TRAIN]} for r in rows]
    assert p.step(same)["critic_updates"] == 2 * 2
    assert _changed(before, _local_weights(p.policy)) == []
    save_policy(p, o / "ppo")
    c = Learner.ppo(
        PPOConfig(
            **OPT, critic_lr=1.0, micro_batch_size=1, critic="model", parallelism=parallelism
        ),
        model,
    )
    c.step(rows[:3])
    save_policy(c, o / "ppo-critic-model")
    try:  # a taken directory: every rank gets the error, none is left waiting
        save_policy(c, o / "ppo-critic-model")
    except ClawError as exc:
        assert "not empty" in str(exc)
    else:
        raise AssertionError("saving into a non-empty directory did not fail")
    if rank == 0:
        (o / "world").write_text(f"{world} {m['loss']!r}\n")
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
