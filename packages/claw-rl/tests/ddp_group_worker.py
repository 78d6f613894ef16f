"""Worker for test_ddp_group.py: GRPO and PPO updates on a batch of one large group-packed sample
and two small per-session ones (ranks are balanced by tokens: rank 0 owns the group, rank 1 both
small samples, so under FSDP rank 0 runs a padding pass), then on the group sample alone (rank 1
owns nothing), then save.

Run as ``python ddp_group_worker.py MODEL OUT`` (1 process) or under
``torchrun --nproc_per_node 2 ddp_group_worker.py MODEL OUT [ddp|fsdp]`` (gloo on CPU).
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from claw_rl import GRPOConfig, Learner, PPOConfig, save_policy  # noqa: E402
from claw_rl._dist import init_from_env, shutdown  # noqa: E402
from rl_testlib import group_rollout, merge_group  # noqa: E402


def main(model: str, out: str, parallelism: str = "ddp") -> None:
    rank, world = init_from_env("gloo")
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    rng = random.Random(5)
    system = [rng.randrange(3, 2000) for _ in range(40)]
    for algo in ("grpo", "ppo"):
        ppo = algo == "ppo"
        sessions = [group_rollout(rng, k, system, 2000, ppo) for k in range(6)]
        group = {**merge_group(sessions[:4]), "sample_id": "group"}
        small = [{**s, "sample_id": f"small{k}"} for k, s in enumerate(sessions[4:])]
        make = Learner.ppo if ppo else Learner.grpo
        cfg = (PPOConfig if ppo else GRPOConfig)(
            lr=10.0,  # with adam_eps 1 (see ddp_worker.py): the update is ~ lr * gradient
            adam_eps=1.0,
            epochs=1,
            minibatches=1,
            micro_batch_size=1,
            parallelism=parallelism,
        )
        learner = make(cfg, model)
        m = learner.step([group, *small])
        learner.step([group])
        save_policy(learner, o / algo)
        if rank == 0:
            (o / f"{algo}-loss").write_text(f"{world} {m['loss']!r}\n")
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
