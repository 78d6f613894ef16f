"""Worker for test_ddp.py: one GRPO and one PPO update on a fixed global batch, then save.

Run as ``python ddp_worker.py MODEL OUT`` (1 process) or under
``torchrun --nproc_per_node 2 ddp_worker.py MODEL OUT`` (gloo on CPU).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from claw_rl import GRPOConfig, GRPOLearner, PPOConfig, PPOLearner  # noqa: E402
from claw_rl._dist import init_from_env  # noqa: E402
from conftest import tree_sample  # noqa: E402

PARENT = [-1, 0, 1, 2, 2, 4, 3, 1, 7]
TRAIN = [0, 0, 1, 1, 1, 1, 1, 0, 1]


def main(model: str, out: str) -> None:
    rank, world = init_from_env("gloo")
    rows = [tree_sample(PARENT, TRAIN, seed=k, sample_id=str(k), vocab=2000, returns=True) for k in range(5)]
    grpo_rows = [{**{k: v for k, v in r.items() if k != "returns"}, "algo": "grpo"} for r in rows]
    g = GRPOLearner(GRPOConfig(lr=1e-3, epochs=2, minibatches=2, micro_batch_size=1, loss_agg="token_mean"), model)
    g.step(grpo_rows)
    g.save(Path(out) / "grpo")
    p = PPOLearner(PPOConfig(lr=1e-3, micro_batch_size=2), model)
    m = p.step(rows)
    p.save(Path(out) / "ppo")
    if rank == 0:
        (Path(out) / "world").write_text(f"{world} {m['loss']!r}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
