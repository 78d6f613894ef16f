"""Quickstart: mix-harness GRPO on one CPU machine, end to end, in a few minutes.

    ./dev/demo                      # from a fresh clone (makes .venvs/workspace first)
    uv run python examples/quickstart.py --steps 12 --seed 1 --task toy-digits --task toy-short

It makes a tiny random policy, starts claw-proxy in-process on it (transformers engine), and for
every step plans the claw-toy tasks for two harness kinds at once -- claw-bench's reference agent
over OpenAI chat and over Anthropic Messages, plus every real harness that is installed --, runs
them in sandboxes, scores the workspaces, builds prefix trees, computes group-relative advantages,
updates the policy with GRPO and loads it back into the proxy. The loop itself is
examples/mix_harness_rl.py; this script picks small settings and shows the result: a per-harness
table and a PNG with reward and Pass@1 per harness, tree token ratio and train-inference mismatch
per step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claw_bench  # noqa: E402
import mix_harness_rl  # noqa: E402

REAL_HARNESSES = ["claude-code", "openclaw-chat", "codex", "mini-swe-agent"]

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument(
    "-o",
    "--output",
    dest="out",
    type=Path,
    default=Path("runs/quickstart"),
    help="run directory (resumable)",
)
p.add_argument("--steps", type=int, default=12)
p.add_argument(
    "--seed", type=int, default=0, help="the run's seed: the same seed prints the same table"
)
p.add_argument("--rollouts", type=int, default=8, help="rollouts per (task, harness) per step")
p.add_argument(
    "--task",
    action="append",
    help="claw-toy tasks (repeatable; default: toy-digits, whose dense reward a tiny model learns in minutes)",
)
p.add_argument("--no-real-harnesses", action="store_true", help="use only the reference agent")
p.add_argument("--backend", default="auto")
args = p.parse_args()

# --- which harnesses ---------------------------------------------------------------------------
harnesses = ["claw-agent-text", "claw-agent-text-anthropic"]
if not args.no_real_harnesses:
    harnesses += [h for h in REAL_HARNESSES if claw_bench.load_harness(h).installed()]
print(f"harnesses: {', '.join(harnesses)}", file=sys.stderr)

# --- the loop ----------------------------------------------------------------------------------
t0 = time.monotonic()
loop_args = [
    "--run-dir",
    str(args.out),
    "--steps",
    str(args.steps),
    "--rollouts",
    str(args.rollouts),
    "--suite",
    "claw-toy",
    "--backend",
    args.backend,
    "--algo",
    "grpo",
    "--seed",
    str(args.seed),
]
for h in harnesses:
    loop_args += ["--harness", h]
for t in args.task or ["toy-digits"]:
    loop_args += ["--task", t]
history = mix_harness_rl.main(loop_args)
elapsed = time.monotonic() - t0

# --- the table ---------------------------------------------------------------------------------
names = sorted({h for row in history for h in row["reward"]})
header = [
    "step",
    "policy",
    *(f"reward {h}" for h in names),
    *(f"pass@1 {h}" for h in names),
    "tree ratio",
    "mismatch",
    "s",
]
lines = [header]
for row in history:
    lines.append(
        [
            str(row["step"]),
            f"v{row['policy_version']}",
            *(f"{row['reward'].get(h, float('nan')):.3f}" for h in names),
            *(f"{row['pass@1'].get(h, float('nan')):.2f}" for h in names),
            f"{row['tree_token_ratio'] or 0:.2f}",
            f"{row.get('mismatch_mean_abs', float('nan')):.1e}",
            f"{row['seconds']:.0f}",
        ]
    )
widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
table = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines)
print(table)
(args.out / "table.txt").write_text(table + "\n")

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
    ax[0].plot(
        steps,
        [r["pass@1"].get(h) for r in history],
        linestyle="--",
        color=f"C{i}",
        label=f"pass@1 {h}",
    )
ax[0].set(title="reward and Pass@1 per harness", xlabel="step", ylim=(0, 1))
ax[0].legend(fontsize=7)
ax[1].plot(steps, [r["tree_token_ratio"] for r in history], marker="o")
ax[1].set(title="tree tokens / flat tokens", xlabel="step")
ax[2].plot(
    steps, [r.get("mismatch_mean_abs") for r in history], marker="o", label="mean |Δ logprob|"
)
ax[2].plot(steps, [r.get("mismatch_max_abs") for r in history], marker="x", label="max |Δ logprob|")
ax[2].set(title="train-inference mismatch (learner vs engine)", xlabel="step", yscale="log")
ax[2].legend(fontsize=7)
fig.tight_layout()
fig.savefig(args.out / "quickstart.png", dpi=110)
print(
    f"\n{len(history)} steps in {elapsed:.0f} s; records, policies and metrics in {args.out}/; "
    f"plot: {args.out / 'quickstart.png'}"
)
