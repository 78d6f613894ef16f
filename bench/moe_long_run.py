"""The long MoE run (issue 40): >= 200 GRPO steps of a tiny Qwen3-MoE on the CPU, and its plot.

Outside CI (hours): examples/mix_harness_rl.py's loop, started from an SFT'd tiny MoE policy
(`--start`, e.g. `examples/quickstart.py --experts 8`'s `policy/sft`), on claw-toy's toy-steps
training split with the quickstart's loop options (group packing, lr 1.5e-4, AdamW eps 1e-5,
48 new tokens a call, harnesses claw-agent-steps over chat and over Anthropic Messages; the proxy
records the engine's routing, the learner replays it: `--routing-replay auto` = r3). The loop
runs in chunks of `--eval-every` steps through the run directory's resume; after each chunk the
newest policy's held-out Pass@1 is measured on toy-steps' held-out split (as the quickstart's
eval: a proxy of its own on that policy, both harnesses, a rollout that does not finish counts
as failed). Per step it collects from the run directory: training reward, the learner's
entropy, mismatch_mean_abs, routing_flip_rate, expert_load_max and grad_norm (metrics.jsonl,
under "learner"; a step without learning signal has no grad_norm), and the KL to the start
policy: on the step's trained samples (steps/<k>/samples.jsonl, whose logprobs are the sampling
policy's), the start policy's logprobs by claw_rl's Learner.logprobs with routing replay r3
(the experts the engine chose), then the mean k3 estimator (r - 1 - log r, r = pi_start /
pi_sampled) over the sampled tokens as packed (a prefix shared by a group counts once); cached
in kl.jsonl, so a rerun only computes new steps. Writes long_run.json (one row per step, the
held-out evals) and long_run.png (one panel per quantity). A killed run continues where it
stopped (the loop's resume; an eval cut off is redone whole; `--plot-only` redraws).

    python examples/quickstart.py --experts 8 --seed 0 -o runs/moe-s0     # policy/sft first
    .venvs/workspace/bin/python bench/moe_long_run.py --start runs/moe-s0/policy/sft \\
        --out runs/moe-long --steps 200

Smoke (2 steps, eval every step, the tiny MoE fixture): bench/test_moe_long_run.py.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import claw_bench  # noqa: E402
import claw_rl  # noqa: E402
import claw_tree  # noqa: E402
import mix_harness_rl  # noqa: E402  (examples/mix_harness_rl.py: the loop)
import transformers  # noqa: E402
from claw_rl.loop import append_rows, completed_steps, read_rows, step_dir  # noqa: E402

HARNESSES = ["claw-agent-steps", "claw-agent-steps-anthropic"]
#: per-step quantities of the learner's metrics row (its "learner" dict)
LEARNER_KEYS = ("entropy", "mismatch_mean_abs", "routing_flip_rate", "expert_load_max", "grad_norm")


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=Path, required=True, help="SFT'd MoE policy directory")
    p.add_argument("--out", type=Path, default=Path("runs/moe-long"), help="the run directory")
    p.add_argument("--steps", type=int, default=200, help="RL steps in all")
    p.add_argument("--eval-every", type=int, default=10, help="held-out Pass@1 every N steps")
    p.add_argument("--tasks-per-step", type=int, default=4, help="training instances per step")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per (task, harness) per step")
    p.add_argument("--eval-tasks", type=int, default=32, help="held-out instances (32: all)")
    p.add_argument("--eval-rollouts", type=int, default=1, help="rollouts per held-out (task, h.)")
    p.add_argument("--lr", type=float, default=1.5e-4, help="RL learning rate (the quickstart's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routing-replay", choices=["auto", "r3", "r2", "off"], default="auto")
    p.add_argument("--backend", default="auto", help="claw-sandbox backend")
    p.add_argument("--timeout-multiplier", type=float, default=1.0)
    p.add_argument("--plot-only", action="store_true", help="recompute the rows and redraw only")
    args = p.parse_args(argv)
    for name in ("steps", "eval_every", "tasks_per_step", "rollouts", "eval_rollouts"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (args.start / "config.json").exists():
        p.error(f"--start {args.start}: no config.json (a Hugging Face policy directory)")
    return args


def log(msg: str) -> None:
    print(f"[moe-long {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loop_args(args, run: Path, steps: int) -> list[str]:
    """examples/mix_harness_rl.py's options: the quickstart's loop_args, --steps `steps`."""
    out = [
        *("--run-dir", str(run), "--seed", str(args.seed), "--backend", args.backend),
        *("--suite", "claw-toy", "--tag", "toy-steps", "--tag", "train"),
        *("--model", str(run / "start-policy"), "--max-new-tokens", "48", "--pack", "group"),
        *("--algo", "grpo", "--steps", str(steps), "--rollouts", str(args.rollouts)),
        *("--tasks-per-step", str(args.tasks_per_step), "--lr", str(args.lr), "--adam-eps", "1e-5"),
        *("--timeout-multiplier", str(args.timeout_multiplier), "--lora-rank", "0"),
        *("--routing-replay", args.routing_replay),
    ]
    for h in HARNESSES:
        out += ["--harness", h]
    return out


def prepare(args, run: Path) -> None:
    """The run directory with its own copy of the start policy (the loop's --model: a resumed run
    does not depend on --start's directory staying as it was) and the proxy secret."""
    run.mkdir(parents=True, exist_ok=True)
    dest = run / "start-policy"
    if not (dest / "config.json").exists():
        tmp = run / ".start-policy.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(args.start, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        (run / "start-policy.txt").write_text(f"{args.start.resolve()}\n")
    if not (run / "secret").exists():  # the loop keeps it too (session tokens are signed with it)
        (run / "secret").write_text(secrets.token_hex(16) + "\n")


def make_learner(args, run: Path, start: Path, done: int):
    """mix_harness_rl.make_learner, except that a learner resumed from a checkpoint takes its
    tokenizer files from the start policy. Workaround: claw_rl.loop.resume leaves the learner's
    model_dir at checkpoints/<k>/model, which the loop deletes KEEP_CHECKPOINTS steps later, so
    the third step after any resume fails in save_checkpoint (copy_tokenizer_files:
    FileNotFoundError); every chunk here resumes. Without LoRA, origin_dir is that start policy."""
    learner = MIX_MAKE_LEARNER(args, run, start, done)
    if done and learner is not None and not args.lora_rank:
        learner.model_dir = learner.origin_dir
    return learner


MIX_MAKE_LEARNER = mix_harness_rl.make_learner
mix_harness_rl.make_learner = make_learner


#: the loop options mix_harness_rl.prepare_run_dir leaves out of config.json (free to change)
LOOP_FREE = ("steps", "tensorboard", "wandb", "executor", "ray_address", "proxy_host", "learner",
             "learner_timeout")  # fmt: skip


def backfill_config(run: Path, argv: list[str]) -> None:
    """An option the loop gained after this run started is taken at the value these arguments
    give it (its default: the script does not pass it), so the loop's config check, which
    refuses a resumed run with other options, lets an older run go on."""
    path = run / "config.json"
    if not path.exists():
        return
    before = json.loads(path.read_text())
    now = {
        k: str(v) if isinstance(v, Path) else v
        for k, v in vars(mix_harness_rl.options(argv)).items()
    }
    if added := {k: v for k, v in now.items() if k not in before and k not in LOOP_FREE}:
        path.write_text(json.dumps({**before, **added}, indent=2) + "\n")
        log(f"{path}: loop options added since the run started, at their defaults: {added}")


def policy_after(run: Path, steps: int) -> Path:
    """The policy in force after `steps` completed steps (0: the start policy)."""
    if steps == 0:
        return run / "start-policy"
    return Path(read_rows(run / "policies.jsonl")[steps - 1]["path"])


# --- held-out Pass@1 ------------------------------------------------------------------------------


def held_out(args, run: Path, steps: int) -> dict:
    """Held-out Pass@1 of the policy after `steps` steps (eval/<steps>/, redone whole when cut
    off), appended to eval.jsonl; a rollout that did not finish counts as not passed."""
    opts = mix_harness_rl.options(loop_args(args, run, steps or 1))
    policy, d = policy_after(run, steps), run / "eval" / f"{steps:04d}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    suite = claw_bench.load_suite("claw-toy")
    tasks = suite.select(tags=["toy-steps", "heldout"]).tasks[: args.eval_tasks or None]
    harnesses = [claw_bench.load_harness(h) for h in HARNESSES]
    secret = (run / "secret").read_text().strip()
    t0 = time.monotonic()
    engine = f"transformers:{policy}"
    with mix_harness_rl.serve(opts, secret, engine, d / "calls.jsonl") as proxy:
        batch = claw_bench.rollouts(
            tasks, harnesses, mix_harness_rl.sandbox(opts, d / "runs.jsonl"),
            samples=args.eval_rollouts, proxy_url=proxy.url, secret=secret.encode(),
            run_id=f"seed{args.seed}-eval-{steps}", group_by=opts.group_by,
            timeout_multiplier=opts.timeout_multiplier,
        )  # fmt: skip
    claw_tree.write_jsonl(batch.outcomes, d / "outcomes.jsonl")
    s = claw_bench.outcome_summary(batch.outcomes)
    per = {h: [bool(o["passed"]) for o in batch.outcomes if o["harness"] == h] for h in HARNESSES}
    row = {
        "steps": steps, "policy": str(policy),
        "pass@1": {h: sum(v) / len(v) for h, v in per.items() if v},
        "pass@1_mean": s["passed"] / max(1, s["rollouts"]), "rollouts": s["rollouts"],
        "infra_errors": s["infra_errors"], "seconds": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    append_rows(run / "eval.jsonl", [row])
    log(f"held-out Pass@1 after {steps} steps: {row['pass@1_mean']:.3f} {row['pass@1']}")
    return row


# --- KL to the start policy -----------------------------------------------------------------------


def k3(start_lp: list[float], sampled_lp: list[float]) -> float:
    """Sum over tokens of k3 = r - 1 - log r, r = pi_start / pi_sampled: an unbiased estimate
    of KL(pi_sampled || pi_start) per token sampled from pi_sampled, never negative (Schulman,
    "Approximating KL divergence", 2020)."""
    total = 0.0
    for a, b in zip(start_lp, sampled_lp, strict=True):
        log_r = a - b
        total += math.expm1(log_r) - log_r
    return total


def kl_to_start(learner, samples_path: Path) -> dict:
    """{"kl_k3": mean k3 over the sampled (trainable) tokens, "tokens"} of one step's samples;
    the start policy replays the engine's recorded experts (the learner's routing replay r3)."""
    samples = claw_rl.read_samples(samples_path) if samples_path.exists() else []
    if not samples:
        return {"kl_k3": None, "tokens": 0}
    lps = learner.logprobs(samples)
    total, n = 0.0, 0
    for s, lp in zip(samples, lps, strict=True):
        idx = [j for j, t in enumerate(s.trainable) if t]
        total += k3([lp[j] for j in idx], [s.logprobs[j] for j in idx])
        n += len(idx)
    return {"kl_k3": total / n if n else None, "tokens": n}


def kl_rows(args, run: Path, steps: int) -> dict[int, dict]:
    """KL to the start policy of every completed step, cached in kl.jsonl (new steps only)."""
    cache = {r["step"]: r for r in read_rows(run / "kl.jsonl")}
    todo = [k for k in range(steps) if k not in cache]
    if todo:
        cfg = claw_rl.GRPOConfig(name="start", routing_replay="r3", seed=args.seed)
        learner = claw_rl.Learner.grpo(cfg, run / "start-policy")
        for k in todo:
            row = {"step": k, **kl_to_start(learner, step_dir(run, k) / "samples.jsonl")}
            append_rows(run / "kl.jsonl", [row])
            cache[k] = row
        log(f"KL to the start policy: steps {todo[0]}..{todo[-1]} computed")
    return cache


# --- rows, JSON and the plot ----------------------------------------------------------------------


def mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def step_rows(run: Path, kl: dict[int, dict]) -> list[dict]:
    """One row per completed step: reward (per harness and mean), the learner's quantities, KL."""
    rows = []
    for m in completed_steps(run):
        learner = m.get("learner", {})
        rows.append(
            {
                "step": m["step"], "policy_version": m["policy_version"],
                "reward": mean(m["reward"].values()), "reward_per_harness": m["reward"],
                **{k: learner.get(k) for k in LEARNER_KEYS},
                "kl_to_start_k3": kl.get(m["step"], {}).get("kl_k3"),
                "no_signal": bool(m.get("no_signal")), "seconds": m.get("seconds"),
            }
        )  # fmt: skip
    return rows


PANELS = [  # key, title
    ("reward", "training reward (mean over harnesses)"),
    ("pass@1", "held-out Pass@1"),
    ("entropy", "entropy (nats / token)"),
    ("kl_to_start_k3", "KL to the start policy (k3)"),
    ("mismatch_mean_abs", "mismatch: mean |learner - engine| logprob"),
    ("routing_flip_rate", "routing flip rate (live vs recorded)"),
    ("expert_load_max", "expert load max (1 = balanced)"),
    ("grad_norm", "gradient norm"),
]


def plot(rows: list[dict], evals: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(17, 7))
    for ax, (key, text) in zip(axes.flat, PANELS, strict=True):
        if key == "pass@1":
            ax.plot([e["steps"] for e in evals], [e["pass@1_mean"] for e in evals], marker="o")
        else:
            pts = [(r["step"], r[key]) for r in rows if r[key] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8)
            if len(pts) >= 10:  # a trailing 10-step mean over the noisy per-step values
                w = [mean([y for _, y in pts[max(0, i - 9) : i + 1]]) for i in range(len(pts))]
                ax.plot([p[0] for p in pts], w, lw=1.8, color="C3")
        if key in ("reward", "pass@1"):
            ax.set_ylim(0, 1)
        ax.set(title=text, xlabel="step")
        ax.title.set_fontsize(9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(args, run: Path) -> None:
    """long_run.json and long_run.png from the run directory as it is now."""
    done = len(completed_steps(run))
    rows = step_rows(run, kl_rows(args, run, done))
    evals = sorted(
        {e["steps"]: e for e in read_rows(run / "eval.jsonl")}.values(), key=lambda e: e["steps"]
    )
    body = {"start": (run / "start-policy.txt").read_text().strip(), "steps": rows, "evals": evals}
    (run / "long_run.json").write_text(json.dumps(body, indent=1) + "\n")
    quiet = sum(r["no_signal"] for r in rows)
    title = (
        f"tiny Qwen3-MoE, GRPO, routing replay {args.routing_replay}: {done} steps "
        f"({quiet} without learning signal); held-out Pass@1 on {args.eval_tasks} tasks"
    )
    plot(rows, evals, run / "long_run.png", title)
    log(f"{run / 'long_run.json'}, {run / 'long_run.png'}: {done} steps, {len(evals)} evals")


# --- the run --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = options(argv)
    transformers.utils.logging.disable_progress_bar()
    run = args.out.resolve()
    prepare(args, run)
    if args.plot_only:
        report(args, run)
        return
    evaluated = {e["steps"] for e in read_rows(run / "eval.jsonl")}
    done = len(completed_steps(run))
    while True:
        if (done % args.eval_every == 0 or done >= args.steps) and done not in evaluated:
            held_out(args, run, done)
            evaluated.add(done)
        report(args, run)
        if done >= args.steps:
            break
        target = min(args.steps, (done // args.eval_every + 1) * args.eval_every)
        t0, before = time.monotonic(), done
        log(f"steps {done}..{target - 1}")
        backfill_config(run, loop_args(args, run, target))
        mix_harness_rl.main(loop_args(args, run, target))
        done = len(completed_steps(run))
        per = (time.monotonic() - t0) / max(1, done - before)
        log(f"{done} of {args.steps} steps done ({per:.1f} s a step in this chunk)")


if __name__ == "__main__":
    main()
