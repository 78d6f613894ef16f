"""Mix-harness RL, the full loop: several harnesses, one policy, one run directory.

Each step plans a batch of tasks for every harness (claw-bench), runs the jobs in sandboxes
against the proxy (claw-sandbox, claw-proxy), scores the final workspaces (claw-bench), packs the
recorded calls into prefix trees with advantages (claw-tree), updates the policy with GRPO or PPO
(claw-rl) and loads the new weights into the proxy. Everything lands in the run directory; a run
that was killed resumes from its last completed step with no rollout lost or counted twice.

    uv run python examples/mix_harness_rl.py --run-dir runs/mix --steps 8 \
        --harness claw-agent-text --harness claw-agent-text-anthropic --suite claw-toy

Run directory:
    config.json          resolved options (a resumed run must pass the same ones)
    secret, admin-token  proxy credentials (session tokens are minted from `secret`)
    calls.jsonl          every model call (claw.call/v1), written by the proxy
    policies.jsonl       claw.policy/v1 of every saved policy; policy/v<N>/ the HF directories
    steps/<k>/           jobs-a<attempt>.jsonl, runs.jsonl, outcomes.jsonl, samples.jsonl
    checkpoints/<k>/     learner state after k completed steps (the last two are kept)
    metrics.jsonl        one line per completed step: the step is done once its line is here
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import claw_bench
import claw_proxy
import claw_rl
import claw_sandbox
import claw_tree
import httpx
import transformers

DEFAULT_HARNESSES = ["claw-agent-text", "claw-agent-text-anthropic"]


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run-dir", type=Path, default=Path("runs/mix"))
    p.add_argument(
        "--model", type=Path, help="HF model directory to start from (default: a new tiny model)"
    )
    p.add_argument("--algo", choices=["grpo", "ppo"], default="grpo")
    p.add_argument(
        "--group-by",
        choices=["task", "task+harness"],
        default="task",
        help="GRPO groups: the task over all harnesses, or each (task, harness)",
    )
    p.add_argument(
        "--harness",
        action="append",
        help=f"harness adapter name, repeatable (default: {DEFAULT_HARNESSES})",
    )
    p.add_argument(
        "--suite", default="claw-toy", help="built-in suite name or a directory of task dirs"
    )
    p.add_argument(
        "--task", action="append", help="only these task ids (repeatable; default: the whole suite)"
    )
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per (task, harness) per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument(
        "--engine",
        default="transformers",
        help="'transformers' (in-process, on the policy dir) or vllm:URL",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer + chat template dir for a vllm: engine (default: --model)",
    )
    p.add_argument(
        "--vllm-reload-method",
        default="claw_reload_weights",
        help="vLLM worker method that loads new weights (examples/gpu/claw_vllm_worker.py)",
    )
    p.add_argument(
        "--backend", default="auto", help="claw-sandbox backend: auto, bwrap, docker, process"
    )
    p.add_argument("--parallel", type=int, default=4, help="sandbox jobs at once")
    p.add_argument(
        "--max-new-tokens", type=int, default=24, help="proxy cap on tokens per model call"
    )
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--epochs", type=int, default=2, help="passes over each step's batch")
    p.add_argument("--minibatches", type=int, default=2, help="optimizer steps per epoch")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.harness = args.harness or list(DEFAULT_HARNESSES)
    return args


# --- the run directory ------------------------------------------------------------------------


def prepare_run_dir(args: argparse.Namespace) -> dict:
    """Create or reopen the run directory; a resumed run must use the same options."""
    run = args.run_dir
    run.mkdir(parents=True, exist_ok=True)
    resolved = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "steps"
    }
    cfg_path = run / "config.json"
    if cfg_path.exists():
        before = json.loads(cfg_path.read_text())
        changed = {k for k in resolved if before.get(k) != resolved[k]}
        if changed:
            raise SystemExit(
                f"{cfg_path}: this run was started with other options ({', '.join(sorted(changed))}); "
                "use a new --run-dir or the same options"
            )
    else:
        cfg_path.write_text(json.dumps(resolved, indent=2) + "\n")
    for name in ("secret", "admin-token"):
        if not (run / name).exists():
            (run / name).write_text(secrets.token_hex(16) + "\n")
    return resolved


def completed_steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a last line cut off by a crash (no newline yet) is not one."""
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def append_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_learner(args: argparse.Namespace, run: Path, start_model: Path, done: int):
    """The learner after `done` completed steps: from their checkpoint, or new on the start model."""
    if done:
        return claw_rl.load_checkpoint(run / "checkpoints" / f"{done:04d}", algo=args.algo)
    if args.algo == "grpo":
        cfg = claw_rl.GRPOConfig(
            name="policy",
            lr=args.lr,
            epochs=args.epochs,
            minibatches=args.minibatches,
            seed=args.seed,
            max_staleness=0,
        )
        return claw_rl.Learner.grpo(cfg, start_model)
    cfg = claw_rl.PPOConfig(
        name="policy",
        lr=args.lr,
        critic_lr=args.lr * 3,
        epochs=args.epochs,
        minibatches=args.minibatches,
        seed=args.seed,
        max_staleness=0,
    )
    return claw_rl.Learner.ppo(cfg, start_model)


# --- one step ----------------------------------------------------------------------------------


def rollouts(
    args, run: Path, step: int, proxy_url: str, secret: bytes, tasks, harnesses, log
) -> list[dict]:
    """Plan, run and score this step's rollouts; resumable: finished jobs are not rerun."""
    d = run / "steps" / f"{step:04d}"
    d.mkdir(parents=True, exist_ok=True)
    runs_path = d / "runs.jsonl"
    done = {
        (r["meta"]["task"], r["meta"]["harness"], r["meta"]["sample"])
        for r in read_jsonl(runs_path)
    }
    attempt = len(list(d.glob("jobs-a*.jsonl")))
    # A retried step re-plans only the rollouts without a run record, under new session ids, so
    # calls recorded by a rollout that was cut off never mix with its rerun. The ids hold the
    # seed, not the run directory's name: the proxy derives each call's sampling seed from the
    # session id, so the same --seed samples the same tokens in any run directory.
    jobs = claw_bench.plan_jobs(
        tasks,
        harnesses,
        samples=args.rollouts,
        proxy_url=proxy_url,
        secret=secret,
        run_id=f"seed{args.seed}-s{step}-a{attempt}",
        group_by=args.group_by,
    )
    todo = [
        j
        for j in jobs
        if (j["meta"]["task"], j["meta"]["harness"], j["meta"]["sample"]) not in done
    ]
    if todo:
        (d / f"jobs-a{attempt}.jsonl").write_text("".join(json.dumps(j) + "\n" for j in todo))
        log(f"step {step}: running {len(todo)} rollouts ({len(done)} already done)")
        claw_sandbox.run_jobs(todo, backend=args.backend, parallel=args.parallel, out=runs_path)
    runs = read_jsonl(runs_path)
    # runs.jsonl is in finishing order, which concurrency decides; the outcomes are not
    outcomes = sorted(
        claw_bench.score_runs(runs),
        key=lambda o: (o.get("task", ""), o.get("harness", ""), o.get("sample", -1)),
    )
    (d / "outcomes.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    return outcomes


def train_step(args, learner, run: Path, step: int, outcomes: list[dict], log) -> dict:
    """Trees, advantages and one policy update from this step's outcomes and recorded calls."""
    sessions = {o["session"] for o in outcomes}
    calls = [
        c
        for c in claw_tree.read_calls(run / "calls.jsonl", skip_invalid=True).records
        if c.session in sessions
    ]
    forest = claw_tree.build_forest(calls)
    stats = claw_tree.forest_stats(forest)
    if args.algo == "grpo":
        batch = claw_tree.build_samples(forest, outcomes, algo="grpo")
        samples = batch.samples
    else:
        batch = claw_tree.build_samples(forest, outcomes, algo="ppo")
        samples = claw_tree.gae_for_samples(batch.samples, learner.values(batch.samples))
    log(f"step {step}: {batch.summary()}")
    d = run / "steps" / f"{step:04d}"
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    metrics = learner.step(samples) if samples else {"skipped": "no samples"}
    return {"stats": stats, "learner": metrics}


def summarise(step: int, outcomes: list[dict], trained: dict, policy: dict, seconds: float) -> dict:
    per_harness: dict[str, list[dict]] = {}
    for o in sorted(outcomes, key=lambda o: o.get("harness", "")):
        per_harness.setdefault(o["harness"], []).append(o)
    ok = lambda rows: [o for o in rows if o["status"] == "ok"]  # noqa: E731
    row = {
        "step": step,
        "policy_version": policy["version"],
        "rollouts": len(outcomes),
        "infra_errors": sum(o["status"] != "ok" for o in outcomes),
        "reward": {
            h: sum(o["reward"] for o in ok(rs)) / max(1, len(ok(rs)))
            for h, rs in per_harness.items()
        },
        "pass@1": {
            h: sum(bool(o["passed"]) for o in ok(rs)) / max(1, len(ok(rs)))
            for h, rs in per_harness.items()
        },
        "tree_token_ratio": trained["stats"].get("tree_token_ratio"),
        "seconds": round(seconds, 2),
    }
    lm = trained["learner"]
    for key in (
        "loss",
        "mismatch_mean_abs",
        "mismatch_max_abs",
        "mismatch_kl",
        "clip_frac",
        "approx_kl",
        "tokens_per_s",
    ):
        if key in lm:
            row[key] = lm[key]
    row["learner"] = lm
    return row


# --- the loop ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None, log=None) -> list[dict]:
    args = options(argv)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    transformers.utils.logging.disable_progress_bar()  # weight loading/saving bars every step are noise
    run = args.run_dir.resolve()
    args.run_dir = run
    prepare_run_dir(args)
    secret = (run / "secret").read_text().strip()
    admin = (run / "admin-token").read_text().strip()

    start_model = args.model or run / "policy" / "v0"
    if args.model is None and not (start_model / "config.json").exists():
        shutil.rmtree(start_model, ignore_errors=True)
        claw_rl.init_tiny(start_model)
    history = completed_steps(run)
    learner = make_learner(args, run, Path(start_model), len(history))
    policies = read_jsonl(run / "policies.jsonl")[
        : len(history)
    ]  # drop a record of an unfinished step
    (run / "policies.jsonl").write_text("".join(json.dumps(p) + "\n" for p in policies))
    serving = (
        policies[-1]
        if policies
        else {"schema": "claw.policy/v1", "name": "policy", "version": 0, "path": str(start_model)}
    )

    suite = claw_bench.load_suite(args.suite)
    tasks = [t for t in suite.tasks if not args.task or t.id in args.task]
    harnesses = [claw_bench.load_harness(h) for h in args.harness]
    engine = f"transformers:{serving['path']}" if args.engine == "transformers" else args.engine
    tokenizer = None if args.engine == "transformers" else str(args.tokenizer or start_model)
    config = claw_proxy.ProxyConfig(
        engine=engine,
        tokenizer=tokenizer,
        secret=secret,
        vllm_reload_method=args.vllm_reload_method,
        admin_token=admin,
        record=str(run / "calls.jsonl"),
        policy_name="policy",
        max_tokens_cap=args.max_new_tokens,
        default_max_tokens=args.max_new_tokens,
        seed=args.seed,  # each call samples with a seed of its own: reruns draw the same tokens
    )
    with (
        claw_proxy.ProxyServer(config) as proxy,
        httpx.Client(base_url=proxy.url, timeout=600) as admin_api,
    ):
        headers = {"Authorization": f"Bearer {admin}"}
        admin_api.post("/admin/policy", json=serving, headers=headers).raise_for_status()
        for step in range(len(history), args.steps):
            t0 = time.monotonic()
            outcomes = rollouts(args, run, step, proxy.url, secret.encode(), tasks, harnesses, log)
            for session in sorted({o["session"] for o in outcomes}):  # finished: free its cache
                r = admin_api.post(f"/admin/sessions/{session}/close", headers=headers)
                if r.status_code != 404:  # 404: no call of it reached this proxy process
                    r.raise_for_status()
            trained = train_step(args, learner, run, step, outcomes, log)
            policy_dir = run / "policy" / f"step-{step + 1:04d}"
            shutil.rmtree(policy_dir, ignore_errors=True)  # left by a run killed in this step
            policy = claw_rl.save_policy(learner, policy_dir)
            # Checkpoint k+1 first, then the records that mark step k done. A crash in between
            # leaves an unused checkpoint: the rerun redoes the update from checkpoint k, on the
            # same rollouts, and overwrites it.
            claw_rl.save_checkpoint(learner, run / "checkpoints" / f"{step + 1:04d}")
            row = summarise(step, outcomes, trained, policy, time.monotonic() - t0)
            append_jsonl(run / "policies.jsonl", [policy])
            append_jsonl(run / "metrics.jsonl", [row])
            history.append(row)
            shutil.rmtree(run / "checkpoints" / f"{step - 1:04d}", ignore_errors=True)
            admin_api.post("/admin/policy", json=policy, headers=headers).raise_for_status()
            log(
                f"step {step}: reward {row['reward']}  pass@1 {row['pass@1']}  -> policy v{policy['version']}"
            )
    return history


if __name__ == "__main__":
    main()
