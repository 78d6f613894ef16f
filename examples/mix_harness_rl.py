"""Mix-harness RL, the full loop: several harnesses, one policy, one run directory.

Each step: claw-bench plans a batch of rollouts for every harness, claw-sandbox runs them against
the proxy (claw-proxy records every call) and claw-bench scores the final workspaces; claw-tree
packs the calls into prefix trees with advantages, claw-rl updates the policy with GRPO or PPO,
and the proxy loads the new weights. A killed run resumes at its last completed step with no
rollout lost or counted twice. The same step through the CLIs only: examples/rl_step.sh.

    uv run python examples/mix_harness_rl.py --run-dir runs/mix --steps 8 \
        --harness claw-agent-text --harness claw-agent-text-anthropic --suite claw-toy

--sft-teacher first records the scripted expert (claw-bench expert) through the same proxy and
harnesses and fine-tunes the start policy on its calls; --eval-tag measures held-out Pass@1 before
SFT, after SFT and after RL (eval.jsonl). examples/quickstart.py runs the toy-steps recipe.

Run directory: config.json (the options; a resumed run must give the same), secret, admin-token,
calls.jsonl (every call), steps/<k>/ (jobs-a<attempt>.jsonl, runs.jsonl, outcomes.jsonl,
samples.jsonl, calls-offset.json: the byte range of calls.jsonl the step read), claw-rl's run
directory (metrics.jsonl: a step is done once its row is there, policies.jsonl, policy/v<N>/,
checkpoints/<k>/), expert.jsonl, teacher/, policy/sft/ and eval/<stage>/, eval.jsonl.

--max-staleness S runs the rollouts of the next S steps while the learner trains, on the policy in
force: step k's rollouts start once step k - S - 1's update is loaded, and the learner drops a
session older than S versions (metrics: staleness, dropped_stale). A fixed --seed gives the same
rollouts and rewards on one machine in the synchronous loop: each call samples with a seed of its
own, from --seed, its session id and its place in the session (claw-proxy serve --seed).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import io
import json
import os
import random
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
import transformers
from claw_rl.loop import append_rows, read_rows, schedule

HARNESSES = ["claw-agent-text", "claw-agent-text-anthropic"]
OPTIONS = [  # flag, default (its type is the option's; None: a path; a list: the choices), help
    ("--run-dir", Path("runs/mix"), "the run directory"),
    ("--model", None, "HF model directory to start from (default: a new tiny model)"),
    ("--algo", ["grpo", "ppo"], "the learner"),
    ("--group-by", ["task", "task+harness"], "GRPO groups: a task over all harnesses, or each"),
    ("--suite", "claw-toy", "built-in suite name or a directory of task dirs"),
    ("--tasks-per-step", 0, "tasks drawn per step, seeded by --seed and the step (0: all)"),
    ("--eval-rollouts", 1, "rollouts per held-out (task, harness)"),
    ("--eval-tasks", 0, "only the first N held-out tasks (0: all)"),
    ("--sft-tasks", 0, "the expert plays the first N tasks (0: all)"),
    ("--teacher-slip", 0.0, "the expert skips its last tool call on this share of the tasks"),
    ("--teacher-rollouts", 1, "teacher rollouts per task and harness (claw-bench expert -n)"),
    ("--sft-keep", ["passed", "all"], "SFT on the teacher rollouts that passed, or on all"),
    ("--sft-lr", 3e-3, "SFT learning rate"),
    ("--sft-schedule", ["constant", "linear"], "SFT lr: constant, or decayed linearly to 0"),
    ("--sft-epochs", 40, "passes over the teacher samples"),
    ("--sft-batch", 16, "teacher sessions per SFT optimizer step (--pack session)"),
    ("--sft-max-tokens", 1024, "--pack group: teacher sessions merged up to this many tokens"),
    ("--pack", ["session", "group"], "one tree per rollout, or per group (prompt stored once)"),
    ("--rollouts", 4, "rollouts per (task, harness) per step"),
    ("--steps", 8, "RL steps"),
    ("--max-staleness", 0, "asynchronous rollouts: S steps ahead (0: synchronous)"),
    ("--engine", "transformers", "'transformers' (in-process, on the policy dir) or vllm:URL"),
    ("--tokenizer", None, "tokenizer + chat template dir for a vllm: engine (default: --model)"),
    ("--vllm-reload-method", "claw_reload_weights", "vLLM worker method that loads weights"),
    ("--backend", "auto", "claw-sandbox backend: auto, bwrap, docker, process"),
    ("--parallel", 4, "sandbox jobs at once"),
    ("--max-new-tokens", 24, "proxy cap on tokens per model call"),
    ("--lr", 1e-2, "RL learning rate (PPO's critic: 3x)"),
    ("--adam-eps", 1e-8, "AdamW epsilon of the RL learner"),
    ("--kl-coef", 0.0, "GRPO: KL penalty to the start (after SFT: the SFT) policy"),
    ("--warmup", 0, "RL learning-rate warmup over the first N optimizer steps"),
    ("--ppo-whiten", ["scale", "center"], "PPO advantage whitening: by the std, or also centred"),
    ("--epochs", 2, "passes over each step's batch"),
    ("--minibatches", 2, "optimizer steps per epoch"),
    ("--seed", 0, "seeds sampling, the task draws and the learner"),
    ("--harness", "append", f"harness adapter name, repeatable (default: {HARNESSES})"),
    ("--task", "append", "only these task ids (default: the whole suite)"),
    ("--tag", "append", "only tasks with all these tags, e.g. train"),
    ("--eval-tag", "append", "held-out tasks (all these tags): their Pass@1 goes to eval.jsonl"),
    ("--split-digits", "store_true", "the new tiny model tokenizes numbers digit by digit"),
    ("--sft-teacher", "store_true", "first SFT the start policy on the scripted expert"),
    ("--tensorboard", "store_true", "also log the metrics to RUN/tensorboard"),
]


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default, text in OPTIONS:
        if default in ("append", "store_true"):
            p.add_argument(flag, action=default, help=text)
        elif isinstance(default, list):
            p.add_argument(flag, choices=default, default=default[0], help=text)
        else:
            p.add_argument(
                flag, type=Path if default is None else type(default), default=default, help=text
            )
    a = p.parse_args(argv)
    if not 0.0 <= a.teacher_slip <= 1.0:
        p.error(f"--teacher-slip must be a fraction in [0, 1], got {a.teacher_slip}")
    for name in ("teacher_rollouts", "sft_max_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.kl_coef and a.algo != "grpo":
        p.error("--kl-coef is GRPO's: claw-rl's PPO has no KL penalty to a reference")
    a.harness = a.harness or list(HARNESSES)
    return a


# --- the run directory, the learner, the proxy ---------------------------------------------------


def prepare_run_dir(args: argparse.Namespace) -> None:
    """Create or reopen the run directory; a resumed run must use the same options (--steps and
    --tensorboard aside: neither changes what a step does)."""
    run, path = args.run_dir, args.run_dir / "config.json"
    run.mkdir(parents=True, exist_ok=True)
    resolved = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    resolved = {k: v for k, v in resolved.items() if k not in ("steps", "tensorboard")}
    if path.exists():
        before = json.loads(path.read_text())
        if changed := sorted(k for k in resolved if before.get(k) != resolved[k]):
            raise SystemExit(
                f"{path}: this run was started with other options ({', '.join(changed)}); "
                "use a new --run-dir or the same options"
            )
    path.write_text(json.dumps(resolved, indent=2) + "\n")
    for name in ("secret", "admin-token"):
        if not (run / name).exists():
            (run / name).write_text(secrets.token_hex(16) + "\n")


def make_learner(args, run: Path, start_model: Path, done: int):
    """The learner after `done` completed steps: from their checkpoint, or new on the start model."""
    if done:
        return claw_rl.loop.resume(run, algo=args.algo)
    common = dict(name="policy", lr=args.lr, warmup_steps=args.warmup, adam_eps=args.adam_eps)
    common |= dict(epochs=args.epochs, minibatches=args.minibatches, seed=args.seed)
    common |= dict(max_staleness=args.max_staleness, drop_stale=True)
    if args.algo == "grpo":
        return claw_rl.Learner.grpo(claw_rl.GRPOConfig(**common, kl_coef=args.kl_coef), start_model)
    whiten_center = args.ppo_whiten == "center"
    cfg = claw_rl.PPOConfig(**common, critic_lr=args.lr * 3, whiten_center=whiten_center)
    return claw_rl.Learner.ppo(cfg, start_model)


def serve(args, secret: str, engine: str, record: Path, tokenizer=None, admin=None):
    """A proxy over `engine` on a free port, recording to `record`. Each call samples with a seed
    of its own, derived from --seed, its session and its place in it: reruns draw the same."""
    n = args.max_new_tokens
    cfg = claw_proxy.ProxyConfig(
        engine=engine, tokenizer=tokenizer, secret=secret, admin_token=admin, record=str(record),
        policy_name="policy", max_tokens_cap=n, default_max_tokens=n, seed=args.seed,
        vllm_reload_method=args.vllm_reload_method,
    )  # fmt: skip
    return claw_proxy.ProxyServer(cfg)


def sandbox(args, runs: Path, log=None, label: str = ""):
    """claw-bench's runner: claw-sandbox runs the jobs, appending to (and resuming from) `runs`."""

    def run(jobs: list[dict]) -> list[dict]:
        if log:
            log(f"{label}: running {len(jobs)} rollouts ({len(read_rows(runs))} already done)")
        return claw_sandbox.run_jobs(jobs, backend=args.backend, parallel=args.parallel, out=runs)

    return run


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_mark(path: Path, mark: dict) -> None:
    """Replace a small JSON file in one step: it is the old one or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(mark) + "\n")
    tmp.replace(path)


# --- teacher, SFT and held-out evaluation --------------------------------------------------------


def play(args, d: Path, engine: str, tokenizer, secret: str, tasks, harnesses, samples: int, label):
    """Rollouts of tasks x harnesses on a proxy of their own over `engine`, recorded in `d`
    (calls, runs, outcomes; a stage cut off midway is redone whole). Returns the outcomes."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with serve(args, secret, engine, d / "calls.jsonl", tokenizer) as proxy:
        plan = dict(proxy_url=proxy.url, secret=secret.encode(), group_by=args.group_by)
        plan |= dict(samples=samples, run_id=f"seed{args.seed}-{label}")
        batch = claw_bench.rollouts(tasks, harnesses, sandbox(args, d / "runs.jsonl"), **plan)
    write_rows(d / "outcomes.jsonl", batch.outcomes)
    return batch.outcomes


def teacher_sft(args, run: Path, start: Path, secret: str, tasks, harnesses, log) -> dict:
    """Record the scripted expert through the proxy (the student's chat template renders its tool
    calls), then SFT the start policy on its rollouts (all of them, or --sft-keep passed: those
    that passed). Writes teacher/ and policy/sft/; returns teacher/sft.json's summary."""
    t0, d, script = time.monotonic(), run / "teacher", run / "expert.jsonl"
    n, slip = args.teacher_rollouts, args.teacher_slip
    write_rows(
        script, claw_bench.families.expert_script(tasks, slip=slip, seed=args.seed, samples=n)
    )
    engine = f"scripted:{script}"
    outcomes = play(args, d, engine, str(start), secret, tasks, harnesses, n, "teacher")
    forest = claw_tree.build_forest(claw_tree.read_calls(d / "calls.jsonl").records)
    group, passed_only = args.pack == "group", args.sft_keep == "passed"
    max_tokens = args.sft_max_tokens if group else None  # group: sessions merged up to this
    batch = claw_tree.build_sft_samples(
        forest, outcomes=outcomes, passed_only=passed_only, pack=args.pack, max_tokens=max_tokens
    )
    if not batch.samples:
        raise SystemExit(f"{d}: no teacher rollout passed, nothing to fine-tune on")
    passed, kept = sum(bool(o["passed"]) for o in outcomes), len(outcomes) - len(batch.excluded)
    which = "them" if passed_only else "all of them"
    log(f"teacher: {passed} of {len(outcomes)} rollouts passed; SFT on {which} ({kept} sessions)")
    per_step = 1 if group else args.sft_batch  # samples per optimizer step
    mb = max(1, len(batch.samples) // per_step)
    decay = args.sft_epochs * mb if args.sft_schedule == "linear" else 0
    cfg = claw_rl.SFTConfig(
        name="policy", lr=args.sft_lr, decay_steps=decay, epochs=args.sft_epochs, minibatches=mb,
        micro_batch_size=per_step, seed=args.seed,
    )  # fmt: skip
    learner = claw_rl.Learner.sft(cfg, start)
    metrics = learner.step(batch.samples)
    shutil.rmtree(run / "policy" / "sft", ignore_errors=True)
    claw_rl.save_policy(learner, run / "policy" / "sft")
    stats = claw_tree.forest_stats(forest)
    summary = {
        "teacher_rollouts": len(outcomes), "teacher_passed": passed, "sft_sessions": kept,
        "teacher_calls": stats["calls"], "dedup_factor": stats["dedup_factor"],
        "sft_samples": len(batch.samples), "sft_tokens": sum(len(x["input_ids"]) for x in batch.samples),
        "loss": metrics["loss"], "seconds": round(time.monotonic() - t0, 2),
    }  # fmt: skip
    (d / "sft.json").write_text(json.dumps(summary) + "\n")  # the stage is done once this exists
    return summary


def evaluate(args, run, secret, stage, policy: Path, tasks, harnesses, log, steps=None) -> None:
    """Held-out Pass@1 of `policy` (eval/<stage>/; a rollout that did not finish counts as not
    passed), appended to eval.jsonl with the number of RL steps before it."""
    d, engine, n = run / "eval" / stage, f"transformers:{policy}", args.eval_rollouts
    outcomes = play(args, d, engine, None, secret, tasks, harnesses, n, f"eval-{stage}")
    per: dict[str, list[bool]] = {}
    for o in outcomes:
        per.setdefault(o["harness"], []).append(bool(o["passed"]))
    s = claw_bench.outcome_summary(outcomes)
    row = {
        "stage": stage, "steps": steps, "policy": str(policy),
        "pass@1": {h: sum(v) / len(v) for h, v in sorted(per.items())},
        "pass@1_mean": s["passed"] / max(1, s["rollouts"]), "rollouts": s["rollouts"],
        "infra_errors": s["infra_errors"], "not_scorable": s["not_scorable"],
    }  # fmt: skip
    append_rows(run / "eval.jsonl", [row])
    log(f"held-out Pass@1 {stage}: {row['pass@1_mean']:.3f} {row['pass@1']}")


# --- one step ------------------------------------------------------------------------------------


def tasks_for_step(args, tasks: list, step: int) -> list:
    """This step's tasks: all of them, or --tasks-per-step drawn by (seed, step)."""
    if not args.tasks_per_step or args.tasks_per_step >= len(tasks):
        return tasks
    drawn = random.Random(f"{args.seed}:{step}").sample(tasks, args.tasks_per_step)
    return sorted(drawn, key=lambda t: t.id)


def rollouts(args, run: Path, step: int, proxy_url: str, secret: bytes, tasks, harnesses, log):
    """Plan, run and score the step's rollouts. Those with a run record are not run again; a
    retry plans the rest under new session ids (attempt a<N>), so the calls of a rollout cut off
    never mix with its rerun. The ids hold the seed, not the run directory: the proxy derives
    each call's sampling seed from the session id, so a --seed samples the same tokens anywhere."""
    d = run / "steps" / f"{step:04d}"
    d.mkdir(parents=True, exist_ok=True)
    attempt, runner = (
        len(list(d.glob("jobs-a*.jsonl"))),
        sandbox(args, d / "runs.jsonl", log, f"step {step}"),
    )

    def run_jobs(jobs: list[dict]) -> list[dict]:
        write_rows(d / f"jobs-a{attempt}.jsonl", jobs)
        return runner(jobs)

    plan = dict(proxy_url=proxy_url, secret=secret, group_by=args.group_by)
    plan |= dict(run_id=f"seed{args.seed}-s{step}-a{attempt}", done=read_rows(d / "runs.jsonl"))
    batch = claw_bench.rollouts(tasks, harnesses, run_jobs, samples=args.rollouts, **plan)
    write_rows(d / "outcomes.jsonl", batch.outcomes)  # sorted: concurrency decides no order
    return batch.outcomes


def mark_step_start(run: Path, step: int) -> None:
    """Before the step's first rollout: remember where calls.jsonl ends (after its last whole
    line), since every call of the step is recorded after that. Kept once written."""
    mark, calls = run / "steps" / f"{step:04d}" / "calls-offset.json", run / "calls.jsonl"
    if mark.exists():
        return
    mark.parent.mkdir(parents=True, exist_ok=True)
    start = 0
    if calls.exists():
        with calls.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
        start = size - len(tail) + tail.rfind(b"\n") + 1
    write_mark(mark, {"start": start})


def step_calls(run: Path, step: int, sessions: set[str]) -> list:
    """The recorded calls of `sessions`, read from the step's start in calls.jsonl to its last
    whole line, so the per-step cost does not grow with the run; the byte range goes to
    steps/<k>/calls-offset.json (a rerun of the step reads from the same start)."""
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
    write_mark(mark, {"start": start, "end": start + len(data)})
    calls = claw_tree.read_calls(io.StringIO(data.decode()), skip_invalid=True).records
    return [c for c in calls if c.session in sessions]


def train_samples(args, learner, run: Path, step: int, outcomes: list[dict], version: int) -> dict:
    """Trees and advantages of the step's rollouts (PPO: GAE with the critic's values), the
    forest's statistics, and the calls' staleness (versions behind the learner: calls)."""
    calls = step_calls(run, step, {o["session"] for o in outcomes})
    forest = claw_tree.build_forest(calls)
    batch = claw_tree.build_samples(forest, outcomes, algo=args.algo, pack=args.pack)
    samples = batch.samples
    if args.algo == "ppo":
        samples = claw_tree.gae_for_samples(samples, learner.values(samples))
    write_rows(run / "steps" / f"{step:04d}" / "samples.jsonl", samples)
    staleness = dict(collections.Counter(str(version - c.policy_version) for c in calls))
    tokens = sum(len(c.completion_ids) for c in calls)
    stats = claw_tree.forest_stats(forest)
    return dict(batch=batch, stats=stats, samples=samples, tokens=tokens, staleness=staleness)


def summarise(outcomes: list[dict], trained: dict, times: dict) -> dict:
    """The example's fields of the step's metrics row; claw_rl.loop adds the learner's."""
    s = claw_bench.outcome_summary(outcomes)  # infra errors and not scorable kept apart
    return {
        **{k: s[k] for k in ("rollouts", "infra_errors", "not_scorable", "reward", "pass@1")},
        "rollouts_failed": s["rollouts"] - s["scored"],
        # over all the step's calls (the learner's tree_ratio is that of the samples trained)
        "tree_token_ratio": trained["stats"].get("tree_token_ratio"),
        "dedup_factor": trained["stats"].get("dedup_factor"),
        "staleness": trained["staleness"],  # {versions behind: calls}
        # from the launch to the last rollout's end (asynchronous: not one of the step's phases)
        "rollout_s": round(times["rollout_s"], 3),
        "rollout_tokens_per_s": round(trained["tokens"] / max(times["rollout_s"], 1e-9), 2),
        "time": {k: round(v, 3) for k, v in times.items() if k != "rollout_s"},
    }


# --- the loop ------------------------------------------------------------------------------------


def warm_start(args, run: Path, secret: str, start: Path, tasks, harnesses, held_out, log) -> Path:
    """Held-out Pass@1 of the start policy, then (--sft-teacher) SFT on the scripted expert and
    the SFT policy's Pass@1; each stage once, a resumed run skips those done. Returns the policy
    RL starts from."""
    evals = {(e["stage"], e.get("steps")) for e in read_rows(run / "eval.jsonl")}
    if held_out and ("start", None) not in evals:
        evaluate(args, run, secret, "start", start, held_out, harnesses, log)
    if not args.sft_teacher:
        return start
    if not (run / "teacher" / "sft.json").exists():
        taught = tasks[: args.sft_tasks or None]
        log(f"SFT: {teacher_sft(args, run, start, secret, taught, harnesses, log)}")
    if held_out and ("sft", None) not in evals:
        evaluate(args, run, secret, "sft", run / "policy" / "sft", held_out, harnesses, log)
    return run / "policy" / "sft"


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
        claw_rl.init_tiny(start, claw_rl.TinySpec(split_digits=args.split_digits))
    suite = claw_bench.load_suite(args.suite)
    tasks = [t for t in suite.select(tags=args.tag).tasks if not args.task or t.id in args.task]
    harnesses = [claw_bench.load_harness(h) for h in args.harness]
    held_out = list(suite.select(tags=args.eval_tag).tasks) if args.eval_tag else []
    held_out = held_out[: args.eval_tasks or None]
    if (args.eval_tag or args.sft_teacher) and args.engine != "transformers":
        raise SystemExit("--eval-tag and --sft-teacher run the transformers engine only")
    if args.eval_tag and not held_out:
        raise SystemExit(f"no task of {args.suite} has all the tags {args.eval_tag}")
    start = warm_start(args, run, secret, start, tasks, harnesses, held_out, log)

    history = claw_rl.loop.completed_steps(run)
    learner = make_learner(args, run, start, len(history))
    policy = claw_rl.loop.latest_policy(run)
    policy = policy or {"schema": "claw.policy/v1", "name": "policy", "version": 0, "path": str(start)}  # fmt: skip
    engine = f"transformers:{policy['path']}" if args.engine == "transformers" else args.engine
    tokenizer = None if args.engine == "transformers" else str(args.tokenizer or start)
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(
            serve(args, secret, engine, run / "calls.jsonl", tokenizer, admin)
        )
        proxy_admin = stack.enter_context(claw_proxy.AdminClient(proxy.url, admin))
        proxy_admin.reload(policy)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.max_staleness + 1)
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        board = None
        if args.tensorboard:  # the library needs the tensorboard package only here
            board = claw_rl.tensorboard.TensorBoard(run / "tensorboard")
            stack.callback(board.close)

        def launch(k: int) -> concurrent.futures.Future:
            mark_step_start(run, k)  # before any call of step k is recorded
            job = (args, run, k, proxy.url, secret.encode(), tasks_for_step(args, tasks, k))
            return pool.submit(rollouts, *job, harnesses, log)

        def unfinished(k: int) -> int:
            planned = len(tasks_for_step(args, tasks, k)) * len(harnesses) * args.rollouts
            return planned - len(read_rows(run / "steps" / f"{k:04d}" / "runs.jsonl"))

        t0, steps = time.monotonic(), range(len(history), args.steps)
        for step, launched, outcomes, ahead in schedule(steps, args.max_staleness, launch):
            running = sum(unfinished(k) for k in ahead)
            for session in sorted({o["session"] for o in outcomes}):  # finished: free its cache
                proxy_admin.close_session(session, missing_ok=True)  # missing: no call reached us
            t1 = time.monotonic()
            trained = train_samples(args, learner, run, step, outcomes, policy["version"])
            log(f"step {step}: {trained['batch'].summary()}")
            times = {"wait_s": t1 - t0, "rollout_s": t1 - launched, "data_s": time.monotonic() - t1}
            extra = {**summarise(outcomes, trained, times), "rollouts_running": running}
            # claw-rl's step: update, policy/v<N>, checkpoint, then the rows that mark it done
            row, policy = claw_rl.loop.train_step(
                learner, trained["samples"], run, step, extra=extra, current=policy
            )
            history.append(row)
            if board is not None:
                board.log(row)
            proxy_admin.reload(policy)
            log(step_line(row, policy, running))
            t0 = time.monotonic()
    evals = {(e["stage"], e.get("steps")) for e in read_rows(run / "eval.jsonl")}
    if held_out and history and ("rl", len(history)) not in evals:
        last = Path(claw_rl.loop.latest_policy(run)["path"])
        evaluate(args, run, secret, "rl", last, held_out, harnesses, log, steps=len(history))
    return history


def step_line(row: dict, policy: dict, running: int) -> str:
    """The step's log line."""
    ok, t = row["rollouts"] - row["rollouts_failed"], row["time"]
    no_signal = row["learner"]["no_signal_reason"] if row.get("no_signal") else None
    return (
        f"step {row['step']}: reward {row['reward']}  pass@1 {row['pass@1']}  -> policy "
        f"v{policy['version']} | rollouts {ok} ok, {row['rollouts_failed']} failed, {running} "
        f"running | staleness {row['staleness']} (dropped {row.get('dropped_stale', 0)}) | "
        f"tokens/s rollout {row['rollout_tokens_per_s']:.0f} train {row.get('tokens_per_s', 0):.0f}"
        f" | tree ratio {row.get('tree_ratio') or 0:.2f} (call dedup {row['dedup_factor']:.2f}) | "
        + " ".join(f"{k[:-2]} {v:.1f}s" for k, v in t.items())
        + (f" | NO LEARNING SIGNAL: {no_signal}" if no_signal else "")
    )


if __name__ == "__main__":
    main()
