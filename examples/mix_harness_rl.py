"""Mix-harness RL, the full loop: several harnesses, one policy, one run directory.

Each step: claw-bench plans rollouts of every (task, harness), claw-sandbox runs them against the
proxy (claw-proxy records every call) and claw-bench scores the final workspaces; claw-tree packs
the calls into prefix trees with advantages, claw-rl updates the policy with GRPO or PPO, and the
proxy loads the new weights. A killed run resumes at its last completed step with no rollout lost
or counted twice. One step through the CLIs only: examples/rl_step.sh; an SFT warm start with
held-out Pass@1: examples/quickstart.py.

    uv run python examples/mix_harness_rl.py --run-dir runs/mix --steps 8 \
        --harness claw-agent-text --harness claw-agent-text-anthropic --suite claw-toy

Run directory: config.json (the options; a resumed run must give the same), secret, admin-token,
calls.jsonl, steps/<k>/ (jobs-a<attempt>, runs, outcomes, samples, batch.json: the samples'
marker, calls-offset.json) and claw-rl's run directory (metrics.jsonl: a step is done once its
row is there; policies.jsonl, policy/v<N>/, checkpoints/). --learner follow: the loop publishes
each step's batch and waits for its rows, written by `claw-rl follow RUN`, a learner job of its
own (torchrun, one node or several; README: On a cluster). --max-staleness S: the rollouts of
the next S steps run while the learner trains (claw_rl.loop.schedule). A fixed --seed gives the
same rollouts and rewards on one machine in the synchronous loop (claw-proxy serve --seed: a
seed per call). --weights memory: each new version reaches the engines in memory (the
transformers engine in this process directly, vLLM over a process group) and policy/v<N>/ is
written only every --checkpoint-every steps and at the last; the default stays disk until the
GPU (NCCL) path is proven. --engine-sleep (one GPU box, vLLM started with --enable-sleep-mode):
the proxy holds new calls and vLLM frees the GPU while the learner trains, then wakes with the
new weights (examples/gpu/launch.sh ENGINE_SLEEP=1).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import functools
import io
import json
import random
import secrets
import shutil
import sys
import time
from pathlib import Path

import claw_bench
import claw_proxy
import claw_rl
import claw_rl.tracking
import claw_rl.transfer
import claw_sandbox
import claw_sandbox.ray_executor
import claw_tree
import torch
import transformers
from claw_rl import loop

OPTIONS = [  # flag, default (its type is the option's; None: a path; a list: the choices), help
    ("--run-dir", Path("runs/mix"), "the run directory"),
    ("--model", None, "HF model directory to start from (default: a new tiny model)"),
    ("--algo", ["grpo", "ppo"], "the learner"),
    ("--group-by", ["task", "task+harness"], "GRPO groups: a task over all harnesses, or each"),
    ("--suite", "claw-toy", "built-in suite name or a directory of task dirs"),
    ("--tasks-per-step", 0, "tasks drawn per step, seeded by --seed and the step (0: all)"),
    ("--pack", ["session", "group", "batch"], "one tree per rollout, group or step's batch"),
    ("--rollouts", 4, "rollouts per (task, harness) per step"),
    ("--steps", 8, "RL steps"),
    ("--max-staleness", 0, "asynchronous rollouts: S steps ahead (0: synchronous)"),
    ("--engine", "transformers", "'transformers' (in-process, on the policy dir) or vllm:URL"),
    ("--tokenizer", None, "tokenizer + chat template dir for a vllm: engine (default: --model)"),
    ("--vllm-reload-method", "claw_reload_weights", "vLLM worker method that loads weights"),
    ("--weights", ["disk", "memory"], "new weights to the engines as policy dirs, or in memory"),
    ("--checkpoint-every", 1, "--weights memory: write policy/v<N> every N steps (and the last)"),
    ("--engine-sleep", "store_true", "one GPU box: vLLM sleeps while the learner trains"),
    ("--backend", "auto", "claw-sandbox backend: auto, bwrap, docker, process"),
    ("--parallel", 4, "sandbox jobs at once"),
    ("--executor", ["local", "ray"], "run the sandbox jobs here, or as Ray tasks over a cluster"),
    ("--ray-address", "", "--executor ray: the cluster (default: RAY_ADDRESS, else a local Ray)"),
    ("--proxy-host", "127.0.0.1", "the proxy's address for the sandboxes (cluster: this node's)"),
    ("--replica", "append", "another vllm:URL replica of the policy behind the proxy, repeatable"),
    ("--max-new-tokens", 24, "proxy cap on tokens per model call"),
    ("--learner", ["in-process", "follow"], "train here, or in `claw-rl follow RUN` (torchrun)"),
    ("--learner-timeout", 3600.0, "--learner follow: seconds to wait for a step's policy"),
    ("--lr", 1e-2, "RL learning rate (PPO's critic: 3x)"),
    ("--adam-eps", 1e-8, "AdamW epsilon of the RL learner"),
    ("--kl-coef", 0.0, "GRPO: KL penalty to the start policy"),
    ("--warmup", 0, "learning-rate warmup over the first N optimizer steps"),
    ("--ppo-whiten", ["scale", "center"], "PPO advantage whitening: by the std, or also centred"),
    ("--lora-rank", 0, "train a LoRA adapter of this rank on the frozen start policy (0: all)"),
    ("--routing-replay", ["auto", "r3", "r2", "off"], "MoE: replay recorded/pi_old routing"),
    ("--moe-aux-loss", 0.0, "MoE: load-balancing auxiliary loss coefficient"),
    ("--epochs", 2, "passes over each step's batch"),
    ("--minibatches", 2, "optimizer steps per epoch"),
    ("--seed", 0, "seeds sampling, the task draws and the learner"),
    ("--harness", "append", "harness adapter, repeatable (default: claw-agent-text, -anthropic)"),
    ("--task", "append", "only these task ids (default: the whole suite)"),
    ("--tag", "append", "only tasks with all these tags, e.g. train"),
    ("--tensorboard", "store_true", "also log the metrics to RUN/tensorboard"),
    ("--timeout-multiplier", 1.0, "every task timeout times this (slow harness, loaded machine)"),
    ("--wandb", "store_true", "also log the metrics to W&B in RUN/wandb (WANDB_MODE=offline)"),
]


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default, text in OPTIONS:
        if default in ("append", "store_true"):
            p.add_argument(flag, action=default, help=text)
        elif isinstance(default, list):
            p.add_argument(flag, choices=default, default=default[0], help=text)
        else:
            kind = Path if default is None else type(default)
            p.add_argument(flag, type=kind, default=default, help=text)
    args = p.parse_args(argv)
    if args.kl_coef and args.algo != "grpo":
        p.error("--kl-coef is GRPO's: claw-rl's PPO has no KL penalty to a reference")
    if args.learner == "follow" and args.algo != "grpo":
        p.error("--learner follow is GRPO's: PPO needs its critic's values (GAE) in the loop")
    if args.weights == "memory" and args.learner == "follow":
        p.error("--weights memory sends from the in-process learner (follow: --weights disk)")
    if args.engine_sleep and not args.engine.startswith("vllm:"):
        p.error("--engine-sleep puts vLLM engines to sleep: it needs --engine vllm:URL")
    if args.engine_sleep and args.max_staleness:
        p.error("--engine-sleep holds every call while the learner trains: --max-staleness 0")
    if args.checkpoint_every < 1:
        p.error("--checkpoint-every must be >= 1")
    args.harness = args.harness or ["claw-agent-text", "claw-agent-text-anthropic"]
    return args


# --- the run directory, the learner, the proxy and the sandboxes ---------------------------------


def prepare_run_dir(args: argparse.Namespace) -> None:
    """Create or reopen the run directory; a resumed run must use the same options (--steps, the
    trackers and where jobs run aside: none of them changes what a step does)."""
    run, path = args.run_dir, args.run_dir / "config.json"
    run.mkdir(parents=True, exist_ok=True)
    resolved = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    free = ("steps", "tensorboard", "wandb", "executor", "ray_address", "proxy_host", "learner",
            "learner_timeout", "engine_sleep")  # fmt: skip
    resolved = {k: v for k, v in resolved.items() if k not in free}
    before = json.loads(path.read_text()) if path.exists() else resolved
    # an option this script gained after the run began counts as its default there
    default = {k: str(v) if isinstance(v, Path) else v for k, v in vars(options([])).items()}
    if changed := ", ".join(
        sorted(k for k in resolved if before.get(k, default.get(k)) != resolved[k])
    ):
        raise SystemExit(
            f"{path}: this run was started with other options ({changed}); "
            "use a new --run-dir or the same options"
        )
    path.write_text(json.dumps(resolved, indent=2) + "\n")
    for name in ("secret", "admin-token"):
        if not (run / name).exists():
            (run / name).write_text(secrets.token_hex(16) + "\n")


def learner_fields(args) -> dict:
    """The learner's config fields (claw_rl.GRPOConfig / PPOConfig); published with each batch,
    so that a `claw-rl follow` learner trains with them too."""
    cfg = dict(
        name="policy", lr=args.lr, warmup_steps=args.warmup, adam_eps=args.adam_eps,
        epochs=args.epochs, minibatches=args.minibatches, seed=args.seed,
        max_staleness=args.max_staleness, drop_stale=True, lora_rank=args.lora_rank,
        routing_replay=args.routing_replay, moe_aux_loss=args.moe_aux_loss,
    )  # fmt: skip
    if args.algo == "grpo":
        return {**cfg, "kl_coef": args.kl_coef}
    return {**cfg, "critic_lr": args.lr * 3, "whiten_center": args.ppo_whiten == "center"}


def make_learner(args, run: Path, start: Path, done: int):
    """The learner after `done` completed steps: from their checkpoint, or new on `start`."""
    if done:
        return loop.resume(run, algo=args.algo)
    if args.algo == "grpo":
        return claw_rl.Learner.grpo(claw_rl.GRPOConfig(**learner_fields(args)), start)
    return claw_rl.Learner.ppo(claw_rl.PPOConfig(**learner_fields(args)), start)


def serve(args, secret: str, engine: str, record: Path, tokenizer=None, admin=None):
    """A proxy over `engine` (and the --replica engines: sticky sessions) on a free port of
    --proxy-host, recording to `record`. Each call samples with a seed of its own, derived from
    --seed, its session and its place in it: reruns draw the same."""
    n = args.max_new_tokens
    cfg = claw_proxy.ProxyConfig(
        engine=engine, replicas=tuple(args.replica or ()), tokenizer=tokenizer, secret=secret,
        admin_token=admin, record=str(record), policy_name="policy", max_tokens_cap=n,
        default_max_tokens=n, seed=args.seed, vllm_reload_method=args.vllm_reload_method,
    )  # fmt: skip
    return claw_proxy.ProxyServer(cfg, host=args.proxy_host)


def sandbox(args, runs: Path):
    """claw-bench's runner: claw-sandbox runs the jobs, appending to (and resuming from) `runs`;
    --executor ray: as Ray tasks, and a job lost with its node is returned but not recorded."""
    if args.executor == "ray":
        return functools.partial(
            claw_sandbox.ray_executor.run_on_ray, backend=args.backend, parallel=args.parallel,
            out=runs, address=args.ray_address or None, record_lost=False,
        )  # fmt: skip
    return functools.partial(
        claw_sandbox.run_jobs, backend=args.backend, parallel=args.parallel, out=runs
    )


# --- one step ------------------------------------------------------------------------------------


def tasks_for_step(args, tasks: list, step: int) -> list:
    """This step's tasks: all of them, or --tasks-per-step drawn by (seed, step)."""
    if not args.tasks_per_step or args.tasks_per_step >= len(tasks):
        return tasks
    drawn = random.Random(f"{args.seed}:{step}").sample(tasks, args.tasks_per_step)
    return sorted(drawn, key=lambda t: t.id)


def rollouts(args, run: Path, step: int, proxy_url: str, secret: bytes, tasks, harnesses, log):
    """Plan, run and score the step's rollouts; those with a run record are not run again, and a
    retry plans the rest under new session ids (attempt a<N>): a cut-off rollout's calls never mix
    with its rerun. The ids hold the seed, not the run directory: the same tokens anywhere.
    Rollouts lost with their Ray node (returned, not recorded) are retried so, at most twice."""
    d = loop.step_dir(run, step)
    d.mkdir(parents=True, exist_ok=True)

    def run_jobs(attempt: int, done: list, jobs: list[dict]) -> list[dict]:
        claw_tree.write_jsonl(jobs, d / f"jobs-a{attempt}.jsonl")
        log(f"step {step}: running {len(jobs)} rollouts ({len(done)} already done)")
        return sandbox(args, d / "runs.jsonl")(jobs)

    for _ in range(3):
        attempt, done = len(list(d.glob("jobs-a*.jsonl"))), loop.read_rows(d / "runs.jsonl")
        batch = claw_bench.rollouts(
            tasks, harnesses, functools.partial(run_jobs, attempt, done), samples=args.rollouts,
            done=done, proxy_url=proxy_url, secret=secret,
            run_id=f"seed{args.seed}-s{step}-a{attempt}", group_by=args.group_by,
            timeout_multiplier=args.timeout_multiplier,
        )  # fmt: skip
        if not (lost := len(batch.runs) - len(loop.read_rows(d / "runs.jsonl"))):
            break
        log(f"step {step}: {lost} rollouts lost with their Ray node or worker; planning them again")
    else:
        raise SystemExit(f"step {step}: rollouts lost three times over; rerun to resume the step")
    # sorted: concurrency decides no order
    claw_tree.write_jsonl(batch.outcomes, d / "outcomes.jsonl")
    return batch.outcomes


def train_samples(args, learner, run: Path, step: int, outcomes: list[dict], version: int) -> dict:
    """Trees and advantages of the step's rollouts (PPO: GAE with the critic's values, so a
    learner; GRPO: None will do), the forest's statistics, and the calls' staleness (versions
    behind the learner: calls)."""
    # only the calls recorded since the step began: the per-step cost does not grow with the run
    text, sessions = loop.step_records(run, step, "calls.jsonl"), {o["session"] for o in outcomes}
    # an MoE policy's routing side store (calls.routing) sits next to the calls file
    records = claw_tree.read_calls(io.StringIO(text), skip_invalid=True, routing_dir=run).records
    calls = [c for c in records if c.session in sessions]
    forest = claw_tree.build_forest(calls)
    # the samples' rows of the experts an MoE policy routed to go to a side store of the step
    routing = loop.step_dir(run, step).resolve() / "samples.routing"
    routing.parent.mkdir(parents=True, exist_ok=True)
    batch = claw_tree.build_samples(
        forest, outcomes, algo=args.algo, pack=args.pack, routing_out=routing
    )
    samples = batch.samples
    if args.algo == "ppo":
        samples = claw_tree.gae_for_samples(samples, learner.values(samples))
    return {
        "batch": batch, "samples": samples, "stats": claw_tree.forest_stats(forest),
        "tokens": sum(len(c.completion_ids) for c in calls),
        "staleness": dict(collections.Counter(str(version - c.policy_version) for c in calls)),
    }  # fmt: skip


def summarise(outcomes: list[dict], trained: dict, times: dict) -> dict:
    """The example's fields of the step's metrics row; claw_rl.loop adds the learner's."""
    s = claw_bench.outcome_summary(outcomes)  # infra errors and not scorable kept apart
    return {
        **{k: s[k] for k in ("rollouts", "infra_errors", "not_scorable", "reward", "pass@1")},
        "rollouts_failed": s["rollouts"] - s["scored"],
        # over all the step's calls (the learner's tree_ratio is that of the samples trained)
        **{k: trained["stats"].get(k) for k in ("tree_token_ratio", "dedup_factor")},
        "staleness": trained["staleness"],  # {versions behind: calls}
        # from the launch to the last rollout's end (asynchronous: not one of the step's phases)
        "rollout_s": round(times["rollout_s"], 3),
        "rollout_tokens_per_s": round(trained["tokens"] / max(times["rollout_s"], 1e-9), 2),
        "time": {k: round(v, 3) for k, v in times.items() if k != "rollout_s"},
    }


def learn(args, learner, run: Path, step: int, samples: list, extra: dict, policy: dict, log):
    """Step `step`'s update, after its batch is published (steps/<k>/samples.jsonl, batch.json):
    here, or (--learner follow: `learner` is None) by `claw-rl follow RUN` in its own job, whose
    rows this waits for. Returns (metrics row, policy record) as claw_rl.loop.train_step does."""
    loop.publish_batch(run, step, samples, extra, learner_fields(args))
    if learner is not None:
        last = step + 1 == args.steps or (step + 1) % args.checkpoint_every == 0
        write = args.weights == "disk" or last
        return loop.train_step(
            learner, samples, run, step, extra=extra, current=policy, write_policy=write
        )
    log(f"step {step}: {len(samples)} samples published; waiting for claw-rl follow")
    try:
        return loop.wait_trained(run, step, args.learner_timeout)
    except claw_rl.ClawError as exc:  # the learner failed or never answered
        raise SystemExit(f"step {step}: {exc}") from None


def push(args, learner, proxy, admin: str, policy: dict, log) -> None:
    """--weights memory: the learner's weights to the engines as `policy`, no files. The
    in-process transformers engine takes them directly (same process); vLLM engines and
    replicas over a process group (claw_rl.transfer.publish: gloo on CPU)."""
    t0 = time.monotonic()
    if args.engine == "transformers" and not args.replica:
        tensors = dict(claw_rl.transfer.named_tensors(learner))
        proxy.load_state(policy, tensors, claw_rl.transfer.lora_scaling(learner))
        how = f"{len(tensors)} tensors in this process"
    else:
        sent = claw_rl.transfer.publish(learner, policy, proxy.url, admin, host=args.proxy_host)
        how = f"{sent['bytes'] / 1e6:.1f} MB in {sent['buckets']} buckets to {sent['world_size'] - 1} ranks"
    log(f"policy v{policy['version']} in memory: {how}, {time.monotonic() - t0:.2f} s")


def sleep_engines(args, proxy_admin, log) -> int | None:
    """--engine-sleep, before the learner trains: the proxy holds new calls and puts the vLLM
    engines to sleep, level 2 (weights freed) when new weights come in memory anyway, else 1
    (weights offloaded to CPU memory: a LoRA run's base, a step without update). The level."""
    if not args.engine_sleep:
        return None
    level = 2 if args.weights == "memory" and not args.lora_rank else 1
    log(f"engines asleep (level {level}): {proxy_admin.sleep(level)['sleep_seconds']:.2f} s")
    return level


def free_learner_cache() -> None:
    """--engine-sleep, after the update: the learner's cached CUDA blocks (activations) back to
    the GPU, where the waking engine's KV cache goes."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- the loop ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, log=None) -> list[dict]:
    args = options(argv)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    transformers.utils.logging.disable_progress_bar()  # loading/saving bars every step are noise
    run = args.run_dir = args.run_dir.resolve()
    prepare_run_dir(args)
    secret, admin = ((run / n).read_text().strip() for n in ("secret", "admin-token"))
    start = args.model or run / "policy" / "v0"
    if args.model is None and not (start / "config.json").exists():
        shutil.rmtree(start, ignore_errors=True)
        claw_rl.init_tiny(start, claw_rl.TinySpec())
    suite = claw_bench.load_suite(args.suite)
    tasks = [t for t in suite.select(tags=args.tag).tasks if not args.task or t.id in args.task]
    harnesses = [claw_bench.load_harness(h) for h in args.harness]

    history = loop.completed_steps(run)
    in_process = args.learner == "in-process"
    learner = make_learner(args, run, start, len(history)) if in_process else None
    v0 = {"schema": "claw.policy/v1", "name": "policy", "version": 0, "path": str(start)}
    policy = loop.latest_policy(run) or v0
    # a LoRA policy (an adapter directory) is served on the base it names, adapter merged
    engine = f"transformers:{policy['path']}" if args.engine == "transformers" else args.engine
    tokenizer = None if args.engine == "transformers" else str(args.tokenizer or start)
    with contextlib.ExitStack() as stack:
        proxy = serve(args, secret, engine, run / "calls.jsonl", tokenizer, admin)
        stack.enter_context(proxy)
        proxy_admin = stack.enter_context(claw_proxy.AdminClient(proxy.url, admin))
        proxy_admin.reload(policy)
        if args.weights == "memory" and history:  # the record's path may hold older weights
            push(args, learner, proxy, admin, policy, log)
        if args.executor == "ray":  # one connection to the cluster for every step's rollouts
            stack.enter_context(claw_sandbox.ray_executor.connected(args.ray_address or None))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.max_staleness + 1)
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        # claw-rl's tensorboard / wandb extras are needed only here; W&B's config: the run's
        cfg = json.loads((run / "config.json").read_text())
        trackers = claw_rl.tracking.open_trackers(
            run, tensorboard=args.tensorboard, wandb=args.wandb, config=cfg
        )
        stack.callback(claw_rl.tracking.close_trackers, trackers)

        def launch(k: int) -> concurrent.futures.Future:
            loop.mark_step_start(run, k, "calls.jsonl")  # before step k's first call
            job = (args, run, k, proxy.url, secret.encode(), tasks_for_step(args, tasks, k))
            return pool.submit(rollouts, *job, harnesses, log)

        def unfinished(k: int) -> int:
            planned = len(tasks_for_step(args, tasks, k)) * len(harnesses) * args.rollouts
            return planned - len(loop.read_rows(loop.step_dir(run, k) / "runs.jsonl"))

        t0, steps = time.monotonic(), range(len(history), args.steps)
        for step, launched, outcomes, ahead in loop.schedule(steps, args.max_staleness, launch):
            running = sum(unfinished(k) for k in ahead)
            for session in sorted({o["session"] for o in outcomes}):  # finished: free its cache
                proxy_admin.close_session(session, missing_ok=True)  # missing: no call reached us
            t1 = time.monotonic()
            trained = train_samples(args, learner, run, step, outcomes, policy["version"])
            log(f"step {step}: {trained['batch'].summary()}")
            times = {"wait_s": t1 - t0, "rollout_s": t1 - launched, "data_s": time.monotonic() - t1}
            extra = {**summarise(outcomes, trained, times), "rollouts_running": running}
            # claw-rl's step: update, policy/v<N>, checkpoint, then the rows that mark it done
            served, asleep = policy["version"], sleep_engines(args, proxy_admin, log)
            row, policy = learn(args, learner, run, step, trained["samples"], extra, policy, log)
            history.append(row)
            for tracker in trackers:
                tracker.log(row)
            if asleep:
                free_learner_cache()
            # a sleeping engine wakes with the new weights (the proxy's /admin/policy), or with
            # its own: level 1's from CPU memory, level 2's (freed) sent again
            if args.weights == "memory" and (policy["version"] != served or asleep == 2):
                push(args, learner, proxy, admin, policy, log)
            elif policy["version"] != served:  # a step without signal keeps the version
                proxy_admin.reload(policy)
            elif asleep:
                log(f"engines awake on v{served}: {proxy_admin.wake()['wake_seconds']:.2f} s")
            failed, dropped = row["rollouts_failed"], row.get("dropped_stale", 0)
            log(
                f"step {step}: reward {row['reward']}  pass@1 {row['pass@1']}  -> policy "
                f"v{policy['version']} | rollouts {row['rollouts'] - failed} ok, {failed} failed, "
                f"{running} running | staleness {row['staleness']} (dropped {dropped}) | "
                + " ".join(f"{k[:-2]} {v:.1f}s" for k, v in row["time"].items())
                + (" | NO LEARNING SIGNAL" if row.get("no_signal") else "")
            )
            t0 = time.monotonic()
    return history


if __name__ == "__main__":
    main()
