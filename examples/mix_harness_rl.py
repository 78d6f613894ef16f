"""Mix-harness RL, the full loop: several harnesses, one policy, one run directory.

Each step plans a batch of tasks for every harness (claw-bench), runs the jobs in sandboxes
against the proxy (claw-sandbox, claw-proxy), scores the final workspaces (claw-bench), packs the
recorded calls into prefix trees with advantages (claw-tree), updates the policy with GRPO or PPO
(claw-rl) and loads the new weights into the proxy. Everything lands in the run directory; a run
that was killed resumes from its last completed step with no rollout lost or counted twice.

    uv run python examples/mix_harness_rl.py --run-dir runs/mix --steps 8 \
        --harness claw-agent-text --harness claw-agent-text-anthropic --suite claw-toy

Multi-turn tool use, warm-started by SFT on teacher trajectories (claw-toy's toy-steps family:
read a number from one file, write it to another): the scripted expert plays the first
--sft-tasks training instances through the same proxy and harnesses, the start policy is
fine-tuned on those calls (claw-rl's SFT learner on claw-tree SFT samples), then RL runs on
--tasks-per-step training instances per step; held-out Pass@1 is measured before SFT, after SFT
and after RL (eval.jsonl). `--algo ppo` runs the same recipe with PPO:

    uv run python examples/mix_harness_rl.py --run-dir runs/steps --steps 8 --rollouts 4 \
        --tag toy-steps --tag train --tasks-per-step 8 --split-digits \
        --sft-teacher --sft-tasks 48 --teacher-rollouts 2 --teacher-slip 0.5 --sft-keep all \
        --sft-epochs 60 --sft-schedule linear --sft-lr 1.5e-3 \
        --eval-tag toy-steps --eval-tag heldout --eval-tasks 32 --eval-rollouts 2 \
        --harness claw-agent-steps --harness claw-agent-steps-anthropic --max-new-tokens 48 \
        --pack group --lr 1.5e-4 --adam-eps 1e-5

(examples/quickstart.py runs exactly this and prints the tables.)

Run directory:
    config.json          resolved options (a resumed run must pass the same ones)
    secret, admin-token  proxy credentials (session tokens are minted from `secret`)
    calls.jsonl          every model call (claw.call/v1), written by the proxy
    steps/<k>/           jobs-a<attempt>.jsonl, runs.jsonl, outcomes.jsonl, samples.jsonl,
                         calls-offset.json (the byte range of calls.jsonl this step read)
    metrics.jsonl, policies.jsonl, policy/v<N>/, checkpoints/<k>/
                         claw-rl's run directory (claw_rl.loop, claw-rl's README): one row per
                         completed step (the step is done once its metrics row is here), the
                         policy record of each step, the HF directories, the last two checkpoints
    expert.jsonl, teacher/   --sft-teacher: the expert's script, its rollouts (calls, runs,
                         outcomes) and sft.json (the stage is done once it is here); policy/sft/
    eval/<stage>/, eval.jsonl  --eval-tag: held-out rollouts and Pass@1 at start, sft, rl

Asynchronous rollouts (`--max-staleness S`, 0 = synchronous): the rollouts of the next S steps
run while the learner trains, on the policy in force; a session may span a weight update, since
every call records the version that answered it (per token in the samples, and the learner's
TIS/MIS use each token's own engine logprob). Step k's rollouts start once step k - S - 1's
update is loaded, so they are at most S versions old when step k trains; the learner drops a
session whose oldest call is older (metrics: staleness, dropped_stale; its group's other
sessions still train). Up to (S + 1) x
--parallel rollouts run at once. Each step reads calls.jsonl from the offset where its
rollouts began, so a kill -9 at any moment resumes with no rollout lost or counted twice.

A fixed --seed gives the same rollouts and rewards on one machine: every call samples with its
own seed, derived from --seed, its session id (which holds the seed, step, task, harness and
sample) and its place in the session (`claw-proxy serve --seed`), and the learner's shuffling is
seeded. The learner's losses and the recorded logprobs can differ in the last float bits between
runs, because the engine batches whichever calls arrive together and a different batch shape
rounds differently; a sampled token changes only if its draw falls within that much of a
boundary (not seen in our reruns). This holds for the synchronous loop: with --max-staleness
S >= 1, which calls of a session a weight update reaches depends on timing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
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
import claw_rl.loop
import claw_rl.tensorboard
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
    p.add_argument(
        "--split-digits",
        action="store_true",
        help="the new tiny model (no --model) tokenizes numbers one digit per token, as Qwen "
        "does, so it can learn to copy numbers it has not seen (toy-steps)",
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
    p.add_argument(
        "--tag", action="append", help="only tasks with all these tags (repeatable), e.g. train"
    )
    p.add_argument(
        "--tasks-per-step",
        type=int,
        default=0,
        help="tasks drawn for each step from the selected ones (seeded by --seed and the step; "
        "0: all of them every step)",
    )
    p.add_argument(
        "--eval-tag",
        action="append",
        help="held-out tasks (all these tags, repeatable, e.g. heldout): Pass@1 of the start "
        "policy, the SFT policy and the last policy goes to eval.jsonl",
    )
    p.add_argument(
        "--eval-rollouts", type=int, default=1, help="rollouts per held-out (task, harness)"
    )
    p.add_argument(
        "--eval-tasks", type=int, default=0, help="only the first N held-out tasks (0: all)"
    )
    p.add_argument(
        "--sft-teacher",
        action="store_true",
        help="first record the scripted expert (the tasks' generated solutions) through the "
        "proxy on every selected task and harness, and SFT the start policy on those calls",
    )
    p.add_argument(
        "--sft-tasks", type=int, default=0, help="the expert plays the first N tasks (0: all)"
    )
    p.add_argument(
        "--teacher-slip",
        type=float,
        default=0.0,
        help="a weaker teacher: on this fraction of the tasks (seeded) the expert skips its last "
        "tool call, so those rollouts fail (claw-bench expert --slip)",
    )
    p.add_argument(
        "--teacher-rollouts",
        type=int,
        default=1,
        help="teacher rollouts per task and harness; above 1 each task's slips are spread over "
        "its rollouts, so no prompt is always abandoned (claw-bench expert -n)",
    )
    p.add_argument(
        "--sft-keep",
        choices=["passed", "all"],
        default="passed",
        help="SFT on the teacher rollouts that passed (rejection sampling) or on all of them "
        "(plain imitation: the student learns the teacher's slips too)",
    )
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument(
        "--sft-schedule",
        choices=["constant", "linear"],
        default="constant",
        help="SFT learning rate: constant, or decayed linearly to 0 over the SFT's optimizer steps "
        "(cleaner tool-call JSON at the end; the quickstart decays over 60 epochs, see the README)",
    )
    p.add_argument("--sft-epochs", type=int, default=40, help="passes over the teacher samples")
    p.add_argument(
        "--sft-batch",
        type=int,
        default=16,
        help="teacher sessions per SFT optimizer step (--pack session)",
    )
    p.add_argument(
        "--sft-max-tokens",
        type=int,
        default=1024,
        help="--pack group: consecutive teacher sessions are merged into one sample (their shared "
        "system prompt and tools stored once) while it holds at most this many tokens; one "
        "sample per SFT optimizer step",
    )
    p.add_argument(
        "--pack",
        choices=["session", "group"],
        default="session",
        help="RL samples: one tree per rollout, or one per group (shared prompt stored once); "
        "SFT samples: one per teacher session, or sessions merged (--sft-max-tokens)",
    )
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per (task, harness) per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="asynchronous rollouts: the rollouts of the next S steps run while the learner "
        "trains, on the policy in force, so a step trains on calls at most S policy versions "
        "old (older samples are dropped and counted); 0: synchronous",
    )
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
    p.add_argument(
        "--adam-eps",
        type=float,
        default=1e-8,
        help="AdamW epsilon of the RL learner (larger: weights with tiny gradients move less)",
    )
    p.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="KL penalty to the start policy (after SFT: the SFT policy); 0 = none",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="RL learning-rate warmup over the first N optimizer steps (0 = none)",
    )
    p.add_argument(
        "--ppo-whiten",
        choices=["scale", "center"],
        default="scale",
        help="PPO advantage whitening: divide by the std only, keeping each advantage's sign, or "
        "also subtract the batch mean (claw-rl whiten_center; on toy-steps seed 0 centring made "
        "a batch that nearly all passed push its right tokens down)",
    )
    p.add_argument("--epochs", type=int, default=2, help="passes over each step's batch")
    p.add_argument("--minibatches", type=int, default=2, help="optimizer steps per epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="also log every metrics row to RUN/tensorboard (needs claw-rl[tensorboard])",
    )
    args = p.parse_args(argv)
    if not 0.0 <= args.teacher_slip <= 1.0:
        p.error(f"--teacher-slip must be a fraction in [0, 1], got {args.teacher_slip}")
    for name in ("teacher_rollouts", "sft_max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.kl_coef and args.algo != "grpo":
        p.error("--kl-coef is GRPO's: claw-rl's PPO has no KL penalty to a reference")
    args.harness = args.harness or list(DEFAULT_HARNESSES)
    return args


# --- the run directory ------------------------------------------------------------------------


def prepare_run_dir(args: argparse.Namespace) -> dict:
    """Create or reopen the run directory; a resumed run must use the same options."""
    run = args.run_dir
    run.mkdir(parents=True, exist_ok=True)
    resolved = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("steps", "tensorboard")  # neither changes what a step does
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
        return claw_rl.loop.resume(run, algo=args.algo)
    if args.algo == "grpo":
        cfg = claw_rl.GRPOConfig(
            name="policy",
            lr=args.lr,
            warmup_steps=args.warmup,
            adam_eps=args.adam_eps,
            kl_coef=args.kl_coef,
            epochs=args.epochs,
            minibatches=args.minibatches,
            seed=args.seed,
            max_staleness=args.max_staleness,
            drop_stale=True,
        )
        return claw_rl.Learner.grpo(cfg, start_model)
    cfg = claw_rl.PPOConfig(
        name="policy",
        whiten_center=args.ppo_whiten == "center",
        lr=args.lr,
        critic_lr=args.lr * 3,
        warmup_steps=args.warmup,
        adam_eps=args.adam_eps,
        epochs=args.epochs,
        minibatches=args.minibatches,
        seed=args.seed,
        max_staleness=args.max_staleness,
        drop_stale=True,
    )
    return claw_rl.Learner.ppo(cfg, start_model)


# --- teacher, SFT and held-out evaluation --------------------------------------------------------


def play(args, d: Path, engine: str, tokenizer, secret: str, tasks, harnesses, samples: int, label):
    """Rollouts of `tasks` x `harnesses` on a proxy of their own over `engine`, recorded in `d`:
    calls.jsonl, runs.jsonl, outcomes.jsonl. Returns the outcomes."""
    shutil.rmtree(d, ignore_errors=True)  # a stage cut off midway is redone whole
    d.mkdir(parents=True)
    config = claw_proxy.ProxyConfig(
        engine=engine,
        tokenizer=tokenizer,
        secret=secret,
        record=str(d / "calls.jsonl"),
        policy_name="policy",
        max_tokens_cap=args.max_new_tokens,
        default_max_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    with claw_proxy.ProxyServer(config) as proxy:
        jobs = claw_bench.plan_jobs(
            tasks,
            harnesses,
            samples=samples,
            proxy_url=proxy.url,
            secret=secret.encode(),
            run_id=f"seed{args.seed}-{label}",
            group_by=args.group_by,
        )
        claw_sandbox.run_jobs(
            jobs, backend=args.backend, parallel=args.parallel, out=d / "runs.jsonl"
        )
    outcomes = claw_bench.score_runs(read_jsonl(d / "runs.jsonl"))
    (d / "outcomes.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    return outcomes


def teacher_sft(args, run: Path, start_model: Path, secret: str, tasks, harnesses, log) -> dict:
    """Record the scripted expert on every task and harness through the proxy (the student's chat
    template renders the expert's tool calls), then SFT the start policy on its rollouts (all of
    them, or with --sft-keep passed those that passed). Writes teacher/ and policy/sft/; returns
    the SFT summary (teacher/sft.json)."""
    d = run / "teacher"
    script = run / "expert.jsonl"
    lines = claw_bench.families.expert_script(
        tasks, slip=args.teacher_slip, seed=args.seed, samples=args.teacher_rollouts
    )
    script.write_text("".join(json.dumps(x) + "\n" for x in lines))
    t0 = time.monotonic()
    outcomes = play(
        args,
        d,
        f"scripted:{script}",
        str(start_model),
        secret,
        tasks,
        harnesses,
        args.teacher_rollouts,
        "teacher",
    )
    calls = claw_tree.read_calls(d / "calls.jsonl").records
    forest = claw_tree.build_forest(calls)
    passed_only = args.sft_keep == "passed"
    group = args.pack == "group"
    batch = claw_tree.build_sft_samples(
        forest,
        outcomes=outcomes,
        passed_only=passed_only,
        pack=args.pack,
        max_tokens=args.sft_max_tokens if group else None,
    )
    if not batch.samples:
        raise SystemExit(f"{d}: no teacher rollout passed, nothing to fine-tune on")
    n_passed = sum(bool(o["passed"]) for o in outcomes)
    kept = len(outcomes) - len(batch.excluded)
    log(
        f"teacher: {n_passed} of {len(outcomes)} rollouts passed; SFT on "
        f"{'them' if passed_only else 'all of them'} ({kept} sessions)"
    )
    from claw_rl.config import SFTConfig

    per_step = 1 if group else args.sft_batch  # samples per optimizer step
    minibatches = max(1, len(batch.samples) // per_step)
    config = SFTConfig(
        name="policy",
        lr=args.sft_lr,
        decay_steps=args.sft_epochs * minibatches if args.sft_schedule == "linear" else 0,
        epochs=args.sft_epochs,
        minibatches=minibatches,
        micro_batch_size=per_step,
        seed=args.seed,
    )
    learner = claw_rl.Learner.sft(config, start_model)
    metrics = learner.step(batch.samples)
    sft_dir = run / "policy" / "sft"
    shutil.rmtree(sft_dir, ignore_errors=True)
    claw_rl.save_policy(learner, sft_dir)
    stats = claw_tree.forest_stats(forest)
    summary = {
        "teacher_rollouts": len(outcomes),
        "teacher_passed": n_passed,
        "sft_sessions": kept,
        "teacher_calls": stats["calls"],
        "dedup_factor": stats["dedup_factor"],
        "sft_samples": len(batch.samples),
        "sft_tokens": sum(len(x["input_ids"]) for x in batch.samples),
        "loss": metrics["loss"],
        "seconds": round(time.monotonic() - t0, 2),
    }
    (d / "sft.json").write_text(json.dumps(summary) + "\n")  # the stage is done once this exists
    return summary


def evaluate(
    args, run: Path, stage: str, policy_dir: Path, secret: str, tasks, harnesses, log, steps=None
):
    """Pass@1 of the policy in `policy_dir` on the held-out `tasks` (eval/<stage>/), appended to
    eval.jsonl as {stage, steps (RL steps before it), policy, pass@1 per harness, pass@1_mean,
    rollouts, infra_errors}."""
    outcomes = play(
        args,
        run / "eval" / stage,
        f"transformers:{policy_dir}",
        None,
        secret,
        tasks,
        harnesses,
        args.eval_rollouts,
        f"eval-{stage}",
    )
    per: dict[str, list[bool]] = {}
    for o in outcomes:
        per.setdefault(o["harness"], []).append(bool(o["passed"]))
    row = {
        "stage": stage,
        "steps": steps,
        "policy": str(policy_dir),
        "pass@1": {h: sum(v) / len(v) for h, v in sorted(per.items())},
        "pass@1_mean": sum(bool(o["passed"]) for o in outcomes) / max(1, len(outcomes)),
        "rollouts": len(outcomes),
        "infra_errors": sum(o["status"] != "ok" for o in outcomes),
    }
    append_jsonl(run / "eval.jsonl", [row])
    log(f"held-out Pass@1 {stage}: {row['pass@1_mean']:.3f} {row['pass@1']}")
    return row


def tasks_for_step(args, tasks: list, step: int) -> list:
    """This step's tasks: all of them, or --tasks-per-step drawn by (seed, step)."""
    if not args.tasks_per_step or args.tasks_per_step >= len(tasks):
        return tasks
    import random

    return sorted(
        random.Random(f"{args.seed}:{step}").sample(tasks, args.tasks_per_step), key=lambda t: t.id
    )


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


def mark_step_start(run: Path, step: int) -> None:
    """Before the first rollout of a step starts: remember where calls.jsonl ends, since every
    call of the step is recorded after that (steps/<k>/calls-offset.json; kept once written)."""
    mark = run / "steps" / f"{step:04d}" / "calls-offset.json"
    if mark.exists():
        return
    mark.parent.mkdir(parents=True, exist_ok=True)
    start = 0
    if (run / "calls.jsonl").exists():
        with (run / "calls.jsonl").open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
        start = size - len(tail) + tail.rfind(b"\n") + 1  # after the last whole line
    tmp = mark.with_name(mark.name + ".tmp")
    tmp.write_text(json.dumps({"start": start}) + "\n")
    tmp.replace(mark)


def step_calls(run: Path, step: int, sessions: set[str]) -> list:
    """The recorded calls of this step's sessions, read from the byte offset of calls.jsonl where
    the step began to its last whole line: each step reads only the calls recorded since the
    previous one (and, asynchronous, the calls of the next S steps so far), so the per-step cost
    does not grow with the run. The range goes to steps/<k>/calls-offset.json; a rerun of the
    step starts from the same offset."""
    mark = run / "steps" / f"{step:04d}" / "calls-offset.json"
    prev = run / "steps" / f"{step - 1:04d}" / "calls-offset.json"
    if mark.exists():
        start = json.loads(mark.read_text())["start"]
    else:  # the previous step's end (0 for the first step, or a run from before the marks)
        start = json.loads(prev.read_text())["end"] if step and prev.exists() else 0
    with (run / "calls.jsonl").open("rb") as f:
        f.seek(start)
        data = f.read()
    data = data[: data.rfind(b"\n") + 1]  # a call still being written is not read
    tmp = mark.with_name(mark.name + ".tmp")
    tmp.write_text(json.dumps({"start": start, "end": start + len(data)}) + "\n")
    tmp.replace(mark)
    text = io.StringIO(data.decode())
    calls = claw_tree.read_calls(text, skip_invalid=True).records
    return [c for c in calls if c.session in sessions]


def train_samples(args, learner, run: Path, step: int, outcomes: list[dict], version, log) -> dict:
    """Trees and advantages from this step's outcomes and recorded calls: the samples, and the
    calls' staleness (policy `version` minus the version that answered the call) as counts."""
    calls = step_calls(run, step, {o["session"] for o in outcomes})
    staleness: dict[str, int] = {}
    for c in calls:
        key = str(version - c.policy_version)
        staleness[key] = staleness.get(key, 0) + 1
    forest = claw_tree.build_forest(calls)
    stats = claw_tree.forest_stats(forest)
    if args.algo == "grpo":
        batch = claw_tree.build_samples(forest, outcomes, algo="grpo", pack=args.pack)
        samples = batch.samples
    else:
        batch = claw_tree.build_samples(forest, outcomes, algo="ppo", pack=args.pack)
        samples = claw_tree.gae_for_samples(batch.samples, learner.values(batch.samples))
    log(f"step {step}: {batch.summary()}")
    d = run / "steps" / f"{step:04d}"
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    tokens = sum(len(c.completion_ids) for c in calls)
    return {"stats": stats, "samples": samples, "completion_tokens": tokens, "staleness": staleness}


def summarise(outcomes: list[dict], trained: dict, times: dict) -> dict:
    """The example's fields of the step's metrics row (claw_rl.loop adds the learner's and the
    time of its phases to `times`)."""
    per_harness: dict[str, list[dict]] = {}
    for o in sorted(outcomes, key=lambda o: o.get("harness", "")):
        per_harness.setdefault(o["harness"], []).append(o)
    ok = lambda rows: [o for o in rows if o["status"] == "ok"]  # noqa: E731
    row = {
        "rollouts": len(outcomes),
        "rollouts_failed": sum(o["status"] != "ok" for o in outcomes),
        "infra_errors": sum(o["status"] != "ok" for o in outcomes),
        "reward": {
            h: sum(o["reward"] for o in ok(rs)) / max(1, len(ok(rs)))
            for h, rs in per_harness.items()
        },
        "pass@1": {
            h: sum(bool(o["passed"]) for o in ok(rs)) / max(1, len(ok(rs)))
            for h, rs in per_harness.items()
        },
        # call-level, over all the step's calls: per-call tokens / the forest's tree tokens (the
        # tree ratio of the samples trained is the learner's tree_ratio, also in the row)
        "tree_token_ratio": trained["stats"].get("tree_token_ratio"),
        "dedup_factor": trained["stats"].get("dedup_factor"),
        "staleness": trained["staleness"],  # {versions behind: calls}
        # rollout_s: from the rollouts' start to the last one's end (asynchronous: they began
        # while earlier steps trained, so it is not one of this step's phases in "time")
        "rollout_s": round(times["rollout_s"], 3),
        "rollout_tokens_per_s": round(
            trained["completion_tokens"] / max(times["rollout_s"], 1e-9), 2
        ),
        "time": {k: round(v, 3) for k, v in times.items() if k != "rollout_s"},
    }
    return row


# --- the loop ----------------------------------------------------------------------------------


def schedule(steps: range, max_staleness: int, launch):
    """The order of work: yields ``(step, started, outcomes, ahead)`` for each step in turn.

    Before step k's outcomes are awaited, the rollouts of k and of the next S = max_staleness
    steps are started, each once, with ``launch(j) -> Future`` of its outcomes; the caller trains
    on step k between two yields, so with S >= 1 the later steps' rollouts run meanwhile, on the
    policy in force (at most S versions behind when their step trains: step j's start waits for
    step j - S - 1's update), and S = 0 is the synchronous loop. ``started``: when step k's
    rollouts were launched (monotonic clock); ``ahead``: the later steps whose rollouts run.
    """
    pending: dict[int, tuple[float, concurrent.futures.Future]] = {}
    try:
        for step in steps:
            for j in range(step, min(step + max_staleness + 1, steps.stop)):
                if j not in pending:
                    pending[j] = (time.monotonic(), launch(j))
            started, future = pending.pop(step)
            yield step, started, future.result(), sorted(pending)
    finally:
        for _, future in pending.values():
            future.cancel()


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
        claw_rl.init_tiny(start_model, claw_rl.TinySpec(split_digits=args.split_digits))
    start_model = Path(start_model)

    suite = claw_bench.load_suite(args.suite)
    tasks = [t for t in suite.select(tags=args.tag).tasks if not args.task or t.id in args.task]
    harnesses = [claw_bench.load_harness(h) for h in args.harness]
    held_out = list(suite.select(tags=args.eval_tag).tasks) if args.eval_tag else []
    held_out = held_out[: args.eval_tasks or None]
    if (args.eval_tag or args.sft_teacher) and args.engine != "transformers":
        raise SystemExit("--eval-tag and --sft-teacher run the transformers engine only")
    if args.eval_tag and not held_out:
        raise SystemExit(f"no task of {args.suite} has all the tags {args.eval_tag}")
    evals = {(e["stage"], e.get("steps")) for e in read_jsonl(run / "eval.jsonl")}
    if held_out and ("start", None) not in evals:
        evaluate(args, run, "start", start_model, secret, held_out, harnesses, log)
    if args.sft_teacher:
        if not (run / "teacher" / "sft.json").exists():
            taught = tasks[: args.sft_tasks or None]
            summary = teacher_sft(args, run, start_model, secret, taught, harnesses, log)
            log(f"SFT: {summary}")
        start_model = run / "policy" / "sft"
        if held_out and ("sft", None) not in evals:
            evaluate(args, run, "sft", start_model, secret, held_out, harnesses, log)

    history = claw_rl.loop.completed_steps(run)
    learner = make_learner(args, run, start_model, len(history))
    serving = claw_rl.loop.latest_policy(run) or {
        "schema": "claw.policy/v1",
        "name": "policy",
        "version": 0,
        "path": str(start_model),
    }

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
        contextlib.ExitStack() as stack,
    ):
        headers = {"Authorization": f"Bearer {admin}"}
        admin_api.post("/admin/policy", json=serving, headers=headers).raise_for_status()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.max_staleness + 1)
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        board = None
        if args.tensorboard:  # the library needs the tensorboard package only here
            board = claw_rl.tensorboard.TensorBoard(run / "tensorboard")
            stack.callback(board.close)

        def launch(k: int) -> concurrent.futures.Future:
            mark_step_start(run, k)  # before any call of step k is recorded
            step_tasks = tasks_for_step(args, tasks, k)
            job = (args, run, k, proxy.url, secret.encode(), step_tasks, harnesses, log)
            return pool.submit(rollouts, *job)

        t0 = time.monotonic()
        steps = range(len(history), args.steps)
        for step, launched, outcomes, ahead in schedule(steps, args.max_staleness, launch):
            running = sum(
                len(tasks_for_step(args, tasks, k)) * len(harnesses) * args.rollouts
                - len(read_jsonl(run / "steps" / f"{k:04d}" / "runs.jsonl"))
                for k in ahead
            )
            for session in sorted({o["session"] for o in outcomes}):  # finished: free its cache
                r = admin_api.post(f"/admin/sessions/{session}/close", headers=headers)
                if r.status_code != 404:  # 404: no call of it reached this proxy process
                    r.raise_for_status()
            t1 = time.monotonic()
            trained = train_samples(args, learner, run, step, outcomes, serving["version"], log)
            times = {"wait_s": t1 - t0, "rollout_s": t1 - launched, "data_s": time.monotonic() - t1}
            # the one step function of claw-rl train: update, policy/v<N>, checkpoint step+1,
            # then the policies.jsonl and metrics.jsonl rows that mark the step done
            row, serving = claw_rl.loop.train_step(
                learner,
                trained["samples"],
                run,
                step,
                extra={**summarise(outcomes, trained, times), "rollouts_running": running},
                current=serving,
            )
            policy = serving
            history.append(row)
            if board is not None:
                board.log(row)
            admin_api.post("/admin/policy", json=policy, headers=headers).raise_for_status()
            t = row["time"]
            log(
                f"step {step}: reward {row['reward']}  pass@1 {row['pass@1']}  -> policy "
                f"v{policy['version']} | rollouts {row['rollouts'] - row['rollouts_failed']} ok, "
                f"{row['rollouts_failed']} failed, {running} running | staleness "
                f"{row['staleness']} (dropped {row.get('dropped_stale', 0)}) | tokens/s "
                f"rollout {row['rollout_tokens_per_s']:.0f} train {row.get('tokens_per_s', 0):.0f} | "
                f"tree ratio {row.get('tree_ratio') or 0:.2f} (call dedup {row['dedup_factor']:.2f}) | "
                + " ".join(f"{k[:-2]} {v:.1f}s" for k, v in t.items())
                + (
                    f" | NO LEARNING SIGNAL: {row['learner']['no_signal_reason']}"
                    if row.get("no_signal")
                    else ""
                )
            )
            t0 = time.monotonic()
    if held_out and history and ("rl", len(history)) not in evals:
        last = Path(claw_rl.loop.latest_policy(run)["path"])
        evaluate(args, run, "rl", last, secret, held_out, harnesses, log, steps=len(history))
    return history


if __name__ == "__main__":
    main()
