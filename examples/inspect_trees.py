"""Inspect a run's prefix trees: token savings, why sessions branched, and one tree drawn out.

    uv run python examples/inspect_trees.py runs/quickstart            # a run directory
    uv run python examples/inspect_trees.py calls.jsonl --session S    # or any claw.call/v1 file

Uses the claw-tree library for the numbers and the `claw-tree show` CLI for the drawing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import claw_tree

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument(
    "source", type=Path, help="run directory (its calls.jsonl) or a claw.call/v1 JSONL file"
)
p.add_argument(
    "--session", help="session to draw (default: the one with the most branches, then tokens)"
)
p.add_argument(
    "--tokenizer",
    type=Path,
    help="HF directory to decode text with (default: the run's first policy)",
)
args = p.parse_args()

calls_path = args.source / "calls.jsonl" if args.source.is_dir() else args.source
tokenizer = args.tokenizer
if tokenizer is None and args.source.is_dir() and (args.source / "policy" / "v0").is_dir():
    tokenizer = args.source / "policy" / "v0"

# --- the forest and its numbers ----------------------------------------------------------------
read = claw_tree.read_calls(calls_path, skip_invalid=True)
for why in read.skipped:
    print(f"skipped {why}", file=sys.stderr)
forest = claw_tree.build_forest(read.records)
stats = claw_tree.forest_stats(forest)
print(f"{stats['sessions']} sessions, {stats['calls']} calls")
print(
    f"flat tokens {stats['flat_tokens']:,} -> tree tokens {stats['tree_tokens']:,} "
    f"(ratio {stats['tree_token_ratio']:.3f}; a trainer that packs per call would process "
    f"{1 / max(stats['tree_token_ratio'], 1e-9):.2f}x more tokens)"
)
print(
    f"trainable tokens {stats['trainable_tokens']:,}; trajectories {stats['trajectories']}; "
    f"branches {stats['branches']} by reason {json.dumps(stats['branch_reasons'])}"
)
print(
    f"calls that reused the previous prompt's tokens: {stats['calls_reusing_prefix']}; "
    f"false forks a re-render would have made: {stats['false_forks_avoided']}"
)

# --- one tree, drawn ---------------------------------------------------------------------------
per_session = [claw_tree.session_stats(forest, t.name) for t in forest.sessions]
session = (
    args.session or max(per_session, key=lambda s: (s["branches"], s["tree_tokens"]))["session"]
)
cmd = [
    shutil.which("claw-tree") or str(Path(sys.executable).with_name("claw-tree")),
    "show",
    session,
    str(calls_path),
    "--skip-invalid",
]
if tokenizer:
    cmd += ["--tokenizer", str(tokenizer)]
print()
sys.stdout.flush()
subprocess.run(cmd, check=True)
