"""Quickstart: multi-turn tool use on one CPU machine, SFT warm start then RL, end to end.

    ./dev/demo                      # from a fresh clone (makes .venvs/workspace first)
    uv run python examples/quickstart.py --seed 1 --algo ppo

The task family is claw-toy's toy-steps: read a number from the named file (two other files hold
decoys), write it to another file, say "done" -- at least two tool calls, scored by a strict
verifier; 128 training and 32 held-out instances; held-out instructions are worded unlike any
training one, and no held-out number (answer or decoy) occurs in training.
The harnesses are claw-bench's tool-calling reference agent over OpenAI chat and over Anthropic
Messages. The script (step 3 is examples/mix_harness_rl.py, the RL loop):

1. makes a tiny random policy (Qwen3 architecture, 2 layers, hidden 128, numbers one token per
   digit) and measures its held-out Pass@1;
2. records a weaker teacher on the first --sft-tasks training instances through claw-proxy and
   both harnesses, --teacher-rollouts times each: the scripted expert, which on --teacher-slip
   of its rollouts stops after reading and says "done" without writing (those rollouts fail),
   spread over each task's rollouts, so every prompt is seen both finished and abandoned;
   fine-tunes the policy on all of the teacher's calls, slips included (plain imitation:
   claw-tree SFT samples, the sessions' shared system prompt and tools stored once per sample;
   claw-rl's SFT learner, lr 1.5e-3 decayed linearly over --sft-epochs); held-out Pass@1 again.
   The student learns the teacher's skill and, at about the teacher's rate, its slips;
3. runs --steps RL steps (GRPO, or PPO with --algo ppo) on --tasks-per-step training instances x
   2 harnesses x --rollouts per step, each rollout a multi-turn session whose calls share their
   prefixes in one tree (AdamW eps 1e-5: with torch's 1e-8 a weight whose gradient is tiny still
   moves by about the learning rate, and one such update broke the tool-call JSON of seed 3's
   policy); held-out Pass@1 of the last policy. Only the verifier's reward tells RL that stopping
   early fails, so RL has to go past its teacher.

With --lora-rank R the RL steps train a LoRA adapter of rank R on the frozen SFT policy (peft:
the workspace has it; pip install 'claw-rl[lora]' 'claw-proxy[lora]' elsewhere): each step saves
and pushes only the adapter, and the proxy serves base + adapter. It takes a larger --lr (the
README's LoRA row: rank 8, 1.5e-3).

It prints the per-step table (reward and Pass@1 per harness on the step's training instances,
tree ratio = the trained samples' tokens as flat per-trajectory sequences / as trained,
train-inference mismatch, mean seconds per rollout in harness start-up and in model calls, the
update's seconds, the step's) and held-out Pass@1
before SFT, after SFT and after RL, and draws them to quickstart.png.

Through the real Claude Code and OpenClaw (./dev/install-harnesses), with claw-agent as a third
harness of the same policy (the README's real-harness table):

    python examples/quickstart.py --harness claude-code --harness openclaw-chat \
        --harness claw-agent-steps --harness-tokenizer --pack batch --sft-max-tokens 8192 ...

--harness-tokenizer first records the expert once through each harness and trains the policy's
tokenizer on those prompts too, so Claude Code's ~25K-token request is ~600 tokens.
Through them a tiny policy learns the tool formats from plain SFT but not the copy of the number
(it recalls training answers instead); --sft-swap-numbers removes the recall, and
--copy-curriculum adds a copy stage before SFT (examples/copy_stage.py): batches of the teacher's
passed sessions with fresh numbers swapped in, one harness added per stage, its copy probed on
the teacher's write calls (teacher/copy.json; sft.json has the probe after SFT).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import secrets
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claw_bench  # noqa: E402
import claw_rl  # noqa: E402
import claw_rl.loop  # noqa: E402
import claw_tree  # noqa: E402
import copy_stage  # noqa: E402
import mix_harness_rl  # noqa: E402
import transformers  # noqa: E402
from claw_rl.loop import append_rows, read_rows  # noqa: E402

DEFAULT_HARNESSES = ["claw-agent-steps", "claw-agent-steps-anthropic"]

p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
)
p.add_argument(
    "-o", "--output", dest="out", type=Path, default=Path("runs/quickstart"), help="run directory"
)
p.add_argument(
    "--seed", type=int, default=0, help="the run's seed: the same seed prints the same table"
)
p.add_argument("--algo", choices=["grpo", "ppo"], default="grpo")
p.add_argument("--steps", type=int, default=8, help="RL steps after SFT")
p.add_argument("--rollouts", type=int, default=4, help="rollouts per (task, harness) per step")
p.add_argument("--tasks-per-step", type=int, default=8, help="training instances per RL step")
p.add_argument("--sft-tasks", type=int, default=48, help="training instances the teacher plays")
p.add_argument(
    "--teacher-rollouts", type=int, default=2, help="teacher rollouts per (task, harness)"
)
p.add_argument("--sft-epochs", type=int, default=60, help="SFT passes over the teacher's calls")
p.add_argument("--layers", type=int, default=2, help="the tiny policy's transformer layers")
p.add_argument("--hidden", type=int, default=128, help="the tiny policy's width (a multiple of 64)")
p.add_argument(
    "--experts",
    type=int,
    default=0,
    help="a Qwen3-MoE policy with this many experts per layer, 2 routed per token (0: dense); "
    "the proxy records the experts it routed to and the learner replays them",
)
p.add_argument(
    "--sft-swap-numbers",
    action="store_true",
    help="every SFT epoch sees each teacher session with the number it copies (tool result -> "
    "tool call) replaced by fresh digits, none of them a held-out number: the student cannot "
    "learn the training answers by heart, only the copy",
)
p.add_argument(
    "--copy-curriculum",
    default="",
    help="a copy stage before SFT (examples/copy_stage.py): HARNESS:STEPS,... -- stage k trains "
    "--copy-batch of the first k harnesses' teacher sessions a step, each with its copied number "
    "swapped for fresh digits (e.g. claw-agent-steps:1500,openclaw-chat:1000,claude-code:3000)",
)
p.add_argument("--copy-batch", type=int, default=8, help="teacher sessions per copy-stage step")
p.add_argument(
    "--copy-probe-every", type=int, default=250, help="copy-stage steps between copy probes"
)
p.add_argument(
    "--teacher-slip",
    type=float,
    default=0.5,
    help="share of the teacher's tasks on which it stops before writing (0: a perfect teacher)",
)
p.add_argument("--eval-tasks", type=int, default=32, help="held-out instances measured (32: all)")
p.add_argument("--eval-rollouts", type=int, default=2, help="rollouts per held-out (task, harness)")
p.add_argument("--lr", type=float, default=1.5e-4, help="RL learning rate")
p.add_argument(
    "--lora-rank",
    type=int,
    default=0,
    help="RL trains a LoRA adapter of this rank on the frozen SFT policy (0: every weight); "
    "the proxy serves base + adapter",
)
p.add_argument("--backend", default="auto", help="claw-sandbox backend")
p.add_argument(
    "--harness",
    action="append",
    help="harness, repeatable (default: claw-agent-steps over chat and over Messages); the real "
    "ones: claude-code, openclaw-chat (./dev/install-harnesses)",
)
p.add_argument(
    "--harness-tokenizer",
    action="store_true",
    help="train the tiny policy's tokenizer on the harnesses' own prompts too (one expert "
    "rollout each, recorded first), merges across spaces, 32K vocabulary: a real harness's "
    "system prompt and tools become about 20x fewer tokens",
)
p.add_argument(
    "--pack",
    choices=["group", "batch"],
    default="group",
    help="RL samples: a group's rollouts, or a step's whole batch, share a sample (the "
    "harness's prompt once per group / per sample)",
)
p.add_argument(
    "--sft-max-tokens", type=int, default=1024, help="teacher sessions merged per SFT sample"
)
p.add_argument(
    "--timeout-multiplier",
    type=float,
    default=1.0,
    help="every task timeout times this (OpenClaw's start-up alone can pass 100 s on a loaded "
    "machine)",
)
args = p.parse_args()
HARNESSES = args.harness or DEFAULT_HARNESSES
if not 0.0 <= args.teacher_slip <= 1.0:
    p.error(f"--teacher-slip must be a fraction in [0, 1], got {args.teacher_slip}")
if args.experts < 0 or args.experts == 1:
    p.error(f"--experts must be 0 (dense) or >= 2, got {args.experts}")
if args.layers < 1 or args.hidden < 64 or args.hidden % 64:
    p.error(
        f"--layers must be >= 1 and --hidden a multiple of 64, got {args.layers}, {args.hidden}"
    )
for name in ("teacher_rollouts", "eval_rollouts", "sft_epochs", "copy_batch"):
    if getattr(args, name) < 1:
        p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
CURRICULUM: list[tuple[str, int]] = []
if args.copy_curriculum:
    try:
        CURRICULUM = copy_stage.parse_curriculum(args.copy_curriculum, HARNESSES)
    except ValueError as exc:
        p.error(str(exc))
run = args.out.resolve()
# the loop's options; the teacher and the held-out rollouts below use the same proxy settings
loop_args = [
    *("--run-dir", str(run), "--seed", str(args.seed), "--backend", args.backend),
    *("--suite", "claw-toy", "--tag", "toy-steps", "--tag", "train"),
    *("--model", str(run / "policy" / "sft"), "--max-new-tokens", "48", "--pack", args.pack),
    *("--algo", args.algo, "--steps", str(args.steps), "--rollouts", str(args.rollouts)),
    *("--tasks-per-step", str(args.tasks_per_step), "--lr", str(args.lr), "--adam-eps", "1e-5"),
    *("--timeout-multiplier", str(args.timeout_multiplier), "--lora-rank", str(args.lora_rank)),
]
for h in HARNESSES:
    loop_args += ["--harness", h]
opts = mix_harness_rl.options(loop_args)


# --- teacher, SFT and held-out Pass@1 -------------------------------------------------------------


def play(d: Path, engine: str, tokenizer, tasks, samples: int, label: str) -> list[dict]:
    """Rollouts of tasks x both harnesses on a proxy of their own over `engine`, recorded in `d`
    (calls, runs, outcomes; a stage cut off midway is redone whole)."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with mix_harness_rl.serve(opts, secret, engine, d / "calls.jsonl", tokenizer) as proxy:
        batch = claw_bench.rollouts(
            tasks, harnesses, mix_harness_rl.sandbox(opts, d / "runs.jsonl"), samples=samples,
            proxy_url=proxy.url, secret=secret.encode(), run_id=f"seed{args.seed}-{label}",
            group_by=opts.group_by, timeout_multiplier=opts.timeout_multiplier,
        )  # fmt: skip
    claw_tree.write_jsonl(batch.outcomes, d / "outcomes.jsonl")
    return batch.outcomes


def expert(tasks, **kw) -> list[dict]:
    """The scripted expert's lines for every harness: claw-agent's alone keyed by task (they
    serve both of its harnesses), each real harness's in its own tools and keyed to it."""
    if all(h.startswith("claw-agent") for h in HARNESSES):
        return claw_bench.families.expert_script(tasks, seed=args.seed, **kw)
    return [
        line
        for h in HARNESSES
        for line in claw_bench.families.expert_script(tasks, seed=args.seed, harness=h, **kw)
    ]


def policy_spec() -> claw_rl.TinySpec:
    """The tiny policy's shape (--layers, --hidden; heads of 32 dimensions), one token per digit."""
    h = args.hidden
    return claw_rl.TinySpec(
        split_digits=True, num_hidden_layers=args.layers, hidden_size=h, intermediate_size=2 * h,
        num_attention_heads=h // 32, num_key_value_heads=h // 64,
        num_experts=args.experts, moe_intermediate_size=h // 2,
    )  # fmt: skip


def harness_spec(d: Path) -> claw_rl.TinySpec:
    """The tiny policy's spec with --harness-tokenizer: its tokenizer also learns the prompts
    the harnesses send, recorded from one expert rollout of a training task each (harvest/)."""
    spec = policy_spec()
    stock = d / "tokenizer"
    if not (stock / "tokenizer.json").exists():
        claw_rl.tiny.build_tokenizer(spec).save_pretrained(stock)
    task = suite.select(tags=["toy-steps", "train"]).tasks[:1]
    claw_tree.write_jsonl(expert(task), d / "expert.jsonl")
    play(d / "calls", f"scripted:{d / 'expert.jsonl'}", str(stock), task, 1, "harvest")
    calls = claw_tree.read_calls(d / "calls" / "calls.jsonl").records
    for h in HARNESSES:  # a harness left out would keep its ~25K-token prompt
        if not any(c.tags.get("harness") == h for c in calls):
            runs = read_rows(d / "calls" / "runs.jsonl")
            why = [f"{r['status']}: {r.get('error')}" for r in runs if r["meta"]["harness"] == h]
            raise SystemExit(f"{d}: harness {h} made no model call while harvesting ({why})")
    tok = transformers.AutoTokenizer.from_pretrained(stock)
    return claw_rl.prompt_spec([c.prompt_ids for c in calls], tok, spec)


def teacher(start: Path, tasks) -> list[dict]:
    """Record the scripted expert through the proxy (the student's chat template renders its tool
    calls) on `tasks` x every harness, --teacher-rollouts times, slips included. Writes teacher/
    (teacher/outcomes.jsonl last: the stage is done once it exists)."""
    d, script, n = run / "teacher", run / "expert.jsonl", args.teacher_rollouts
    if (d / "outcomes.jsonl").exists():
        return read_rows(d / "outcomes.jsonl")
    claw_tree.write_jsonl(expert(tasks, slip=args.teacher_slip, samples=n), script)
    return play(d, f"scripted:{script}", str(start), tasks, n, "teacher")


@functools.cache
def held_out_numbers() -> frozenset[str]:
    """Every number in a held-out task (instruction and files, answers and decoys): the digits
    --sft-swap-numbers never draws, so the augmented training data shares none with them (read
    once: the copy stage, its probes and SFT all ask)."""
    every = suite.select(tags=["toy-steps", "heldout"]).tasks
    texts = [t.instruction for t in every] + [str(v) for t in every for v in t.workspace.values()]
    return frozenset(m for x in texts for m in re.findall(r"[0-9]+", x))


def digit_ids(tokenizer_dir: Path) -> list[int]:
    """The token ids of "0".."9" (number swaps and the copy probe need one token per digit)."""
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    digits = [tok.encode(str(k), add_special_tokens=False) for k in range(10)]
    if any(len(ids) != 1 for ids in digits):
        raise SystemExit(f"{tokenizer_dir}: swapping numbers needs one token per digit")
    return [d[0] for d in digits]


def probe(policy, calls: list[dict], ids: list[int]) -> dict[str, list[int]]:
    """Per harness [copied, probed] over the teacher's write calls with fresh numbers swapped in
    (copy_stage.probe; the same seeded numbers at every probe of a run)."""
    rng = random.Random(f"probe:{args.seed}")
    return copy_stage.probe(policy, calls, ids, rng, avoid=held_out_numbers())


def copy(start: Path, calls: list, outcomes: list[dict], ids: list[int]) -> Path:
    """--copy-curriculum: the copy stage (examples/copy_stage.py) on the teacher's passed
    sessions, lr 1.5e-3 constant, probed every --copy-probe-every steps. Writes policy/copy/ and
    teacher/copy.json (the stage is done once it exists). Returns the policy SFT starts from."""
    d, out = run / "teacher", run / "policy" / "copy"
    if not CURRICULUM:
        return start
    if (d / "copy.json").exists():
        return out
    t0 = time.monotonic()
    batch = claw_tree.build_sft_samples(
        claw_tree.build_forest(calls), outcomes=outcomes, pack="session", passed_only=True
    )
    sessions = copy_stage.copy_sessions(batch.samples, ids)
    probed = copy_stage.probe_calls(calls, ids)
    cfg = claw_rl.SFTConfig(name="policy", lr=1.5e-3, micro_batch_size=args.copy_batch)
    learner = claw_rl.Learner.sft(cfg, start)

    def on_probe(step: int, stage: str) -> dict:
        got = probe(learner.policy, probed, ids)
        print(f"copy stage step {step} ({stage}): copied {got}", file=sys.stderr)
        return {"copied": got}

    log = copy_stage.train(
        learner, sessions, CURRICULUM, batch=args.copy_batch, digit_ids=ids,
        rng=random.Random(f"copy:{args.seed}"), avoid=held_out_numbers(),
        every=args.copy_probe_every, on_probe=on_probe,
    )  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    claw_rl.save_policy(learner, out)
    summary = {
        "curriculum": CURRICULUM, "batch": args.copy_batch,
        "sessions": {h: len(v) for h, v in sessions.items()}, "probe_calls": len(probed),
        "log": log, "seconds": round(time.monotonic() - t0, 2),
    }  # fmt: skip
    (d / "copy.json").write_text(json.dumps(summary) + "\n")
    return out


def swapped_epochs(samples: list[dict], ids: list[int]):
    """--sft-swap-numbers: each epoch's SFT batch, the teacher's samples with every copied number
    replaced by fresh digits, drawn anew every epoch (seeded) and never a held-out number."""
    avoid, rng = held_out_numbers(), random.Random(f"swap:{args.seed}")
    for _ in range(args.sft_epochs):
        yield [claw_tree.swap_copied_numbers(x, ids, rng, avoid=avoid)[0] for x in samples]


def sft(start: Path, calls: list, outcomes: list[dict], ids: list[int]) -> dict:
    """SFT the start policy on all the teacher's rollouts, slips included (claw-tree SFT samples,
    teacher sessions merged up to --sft-max-tokens, one sample per optimizer step; claw-rl's SFT
    learner, lr 1.5e-3 decayed linearly to 0 over --sft-epochs). Writes policy/sft/ and
    teacher/sft.json (the stage is done once it exists)."""
    t0, d = time.monotonic(), run / "teacher"
    forest = claw_tree.build_forest(calls)
    batch = claw_tree.build_sft_samples(
        forest, outcomes=outcomes, pack="group", max_tokens=args.sft_max_tokens
    )
    passed = sum(bool(o["passed"]) for o in outcomes)
    print(
        f"teacher: {passed} of {len(outcomes)} rollouts passed; SFT on all of them", file=sys.stderr
    )
    if not batch.samples:
        raise SystemExit(f"{d}: the teacher left no call to fine-tune on")
    steps = len(batch.samples)  # one optimizer step per sample, per epoch
    swap = args.sft_swap_numbers  # then one learner step per epoch, each on fresh numbers
    cfg = claw_rl.SFTConfig(
        name="policy", lr=1.5e-3, decay_steps=args.sft_epochs * steps,
        epochs=1 if swap else args.sft_epochs, minibatches=steps, micro_batch_size=1,
        seed=args.seed,
    )  # fmt: skip
    learner = claw_rl.Learner.sft(cfg, start)
    epochs = swapped_epochs(batch.samples, ids) if swap else [batch.samples]
    loss, swapped = 0.0, 0
    for samples in epochs:
        swapped += sum(x["tags"].get("numbers_swapped", 0) for x in samples)
        loss = learner.step(samples)["loss"]
    shutil.rmtree(run / "policy" / "sft", ignore_errors=True)
    claw_rl.save_policy(learner, run / "policy" / "sft")
    stats = claw_tree.forest_stats(forest)
    copied = probe(learner.policy, copy_stage.probe_calls(calls, ids), ids)
    summary = {
        "teacher_rollouts": len(outcomes), "teacher_passed": passed,
        "sft_sessions": len(outcomes) - len(batch.excluded), "teacher_calls": stats["calls"],
        "dedup_factor": stats["dedup_factor"], "sft_samples": len(batch.samples),
        "sft_tokens": sum(len(x["input_ids"]) for x in batch.samples), "loss": loss,
        "numbers_swapped": swapped, "copied": copied, "seconds": round(time.monotonic() - t0, 2),
    }  # fmt: skip
    (d / "sft.json").write_text(json.dumps(summary) + "\n")
    return summary


def evaluate(stage: str, policy: Path, steps: int | None = None) -> None:
    """Held-out Pass@1 of `policy` (eval/<stage>/; a rollout that did not finish counts as not
    passed), appended to eval.jsonl with the number of RL steps before it."""
    n, label = args.eval_rollouts, f"eval-{stage}"
    outcomes = play(run / "eval" / stage, f"transformers:{policy}", None, held_out, n, label)
    s = claw_bench.outcome_summary(outcomes)
    per = {h: [bool(o["passed"]) for o in outcomes if o["harness"] == h] for h in HARNESSES}
    row = {
        "stage": stage, "steps": steps, "policy": str(policy),
        "pass@1": {h: sum(v) / len(v) for h, v in per.items() if v},
        "pass@1_mean": s["passed"] / max(1, s["rollouts"]), "rollouts": s["rollouts"],
        "infra_errors": s["infra_errors"], "not_scorable": s["not_scorable"],
    }  # fmt: skip
    append_rows(run / "eval.jsonl", [row])
    print(f"held-out Pass@1 {stage}: {row['pass@1_mean']:.3f} {row['pass@1']}", file=sys.stderr)


t0 = time.monotonic()
transformers.utils.logging.disable_progress_bar()  # loading/saving bars at every stage are noise
run.mkdir(parents=True, exist_ok=True)
if not (run / "secret").exists():  # the loop keeps it (its session tokens are signed with it)
    (run / "secret").write_text(secrets.token_hex(16) + "\n")
secret = (run / "secret").read_text().strip()
suite = claw_bench.load_suite("claw-toy")
harnesses = [claw_bench.load_harness(h) for h in HARNESSES]
held_out = suite.select(tags=["toy-steps", "heldout"]).tasks[: args.eval_tasks or None]
start = run / "policy" / "v0"
if not (start / "config.json").exists():  # a tiny random policy, one token per digit
    shutil.rmtree(start, ignore_errors=True)
    spec = policy_spec()
    if args.harness_tokenizer:
        spec = harness_spec(run / "harvest")
    claw_rl.init_tiny(start, spec)
done = {(e["stage"], e.get("steps")) for e in read_rows(run / "eval.jsonl")}
if ("start", None) not in done:
    evaluate("start", start)
if not (run / "teacher" / "sft.json").exists():
    taught = suite.select(tags=["toy-steps", "train"]).tasks[: args.sft_tasks or None]
    outcomes = teacher(start, taught)  # the teacher's calls, read once for both stages
    calls, ids = claw_tree.read_calls(run / "teacher" / "calls.jsonl").records, digit_ids(start)
    print(f"SFT: {sft(copy(start, calls, outcomes, ids), calls, outcomes, ids)}", file=sys.stderr)
if ("sft", None) not in done:
    evaluate("sft", run / "policy" / "sft")
history = mix_harness_rl.main(loop_args)
if history and ("rl", len(history)) not in done:
    evaluate("rl", Path(claw_rl.loop.latest_policy(run)["path"]), steps=len(history))
elapsed = time.monotonic() - t0
evals = {e["stage"]: e for e in read_rows(run / "eval.jsonl")}

# --- the tables ---------------------------------------------------------------------------------


def num(x: float | None) -> float:
    """A mean of no scored rollout (all of a harness's failed or were not scorable) is nan."""
    return float("nan") if x is None else x


def rollout_phases(steps: list[int]) -> dict[int, dict[str, float]]:
    """Per RL step, mean seconds per rollout: harness start-up (the job's start to its first
    model call, the sandbox's set-up included) and model calls (its calls' durations summed)."""
    spans: dict[str, list[float]] = {}
    for c in read_rows(run / "calls.jsonl"):
        spans.setdefault(c["session"], []).append((c["started_at"], c["ended_at"]))
    out = {}
    for k in steps:
        startup, model = [], []
        for r in read_rows(run / "steps" / f"{k:04d}" / "runs.jsonl"):
            mine = spans.get(r["meta"]["session"], [])
            if mine and r.get("started_at"):
                startup.append(min(a for a, _ in mine) - r["started_at"])
                model.append(sum(b - a for a, b in mine))
        n = max(1, len(startup))
        out[k] = {"startup_s": sum(startup) / n, "model_s": sum(model) / n}
    return out


def render(lines: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


names = sorted({h for row in history for h in row["reward"]})
steps_table = [
    [
        "step",
        "policy",
        *(f"reward {h}" for h in names),
        *(f"pass@1 {h}" for h in names),
        "tree ratio",
        "mismatch",
        "start-up s",
        "model s",
        "train s",
        "s",
    ]
]
phases = rollout_phases([r["step"] for r in history])
for row in history:
    steps_table.append(
        [
            str(row["step"]),
            f"v{row['policy_version']}",
            *(f"{num(row['reward'].get(h)):.3f}" for h in names),
            *(f"{num(row['pass@1'].get(h)):.2f}" for h in names),
            f"{row.get('tree_ratio') or 0:.2f}",
            f"{row.get('mismatch_mean_abs', float('nan')):.1e}",
            f"{phases[row['step']]['startup_s']:.1f}",
            f"{phases[row['step']]['model_s']:.1f}",
            f"{row['time'].get('train_s', 0.0):.0f}",
            f"{row['seconds']:.0f}",
        ]
    )
stage_names = {"start": "before SFT", "sft": "after SFT", "rl": f"after {args.algo.upper()}"}
held_table = [["held-out Pass@1", *HARNESSES, "mean", "rollouts"]]
for stage, label in stage_names.items():
    if stage in evals:
        e = evals[stage]
        held_table.append(
            [
                label,
                *(f"{num(e['pass@1'].get(h)):.3f}" for h in HARNESSES),
                f"{e['pass@1_mean']:.3f}",
                str(e["rollouts"]),
            ]
        )
text = render(steps_table) + "\n\n" + render(held_table)
print(text)
(args.out / "table.txt").write_text(text + "\n")
(args.out / "heldout.json").write_text(
    json.dumps({s: evals[s]["pass@1_mean"] for s in stage_names if s in evals}) + "\n"
)

# --- the picture -------------------------------------------------------------------------------
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

steps = [r["step"] for r in history]
fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
for i, h in enumerate(names):
    ax[0].plot(
        steps, [r["reward"].get(h) for r in history], marker="o", color=f"C{i}", label=f"reward {h}"
    )
ax[0].set(title="training reward per harness (RL steps)", xlabel="step", ylim=(0, 1))
ax[0].legend(fontsize=7)
ax[1].plot(steps, [r.get("tree_ratio") for r in history], marker="o")
ax[1].set(title="tree ratio (flat tokens / trained tokens)", xlabel="step")
ax[1].set_ylim(bottom=1.0)  # 1 = no shared prefix
labels = [stage_names[s] for s in stage_names if s in evals]
ax[2].bar(labels, [evals[s]["pass@1_mean"] for s in stage_names if s in evals], color="C2")
ax[2].set(title="held-out Pass@1", ylim=(0, 1))
fig.tight_layout()
fig.savefig(args.out / "quickstart.png", dpi=110)
print(
    f"\n{len(history)} RL steps in {elapsed:.0f} s in all; records, policies and metrics in "
    f"{args.out}/; plot: {args.out / 'quickstart.png'}"
)
