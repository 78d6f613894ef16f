"""launch.sh's input checks: the suite loads, and every harness's binaries are on PATH.

    python examples/gpu/preflight.py --suite DIR --harness claude-code --harness openclaw-chat

Prints what it found on stderr; exits 1 naming what is missing (a harness binary: install it
with ./dev/install-harnesses, which puts it in .tools/bin).
"""

from __future__ import annotations

import argparse
import shutil
import sys

import claw_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, help="built-in suite name or a task directory")
    ap.add_argument("--harness", action="append", required=True, help="harness, repeatable")
    args = ap.parse_args(argv)
    problems = []
    try:
        suite = claw_bench.load_suite(args.suite)
    except claw_bench.ClawError as exc:
        problems.append(f"suite {args.suite}: {exc}")
    else:
        print(f"preflight: suite {args.suite}: {len(suite.tasks)} tasks", file=sys.stderr)
        for task_id, why in suite.skipped:
            print(f"preflight:   skipped {task_id}: {why}", file=sys.stderr)
        if not suite.tasks:
            problems.append(f"suite {args.suite}: no task loads")
    for name in args.harness:
        try:
            harness = claw_bench.load_harness(name)
        except claw_bench.ClawError as exc:
            problems.append(str(exc))
            continue
        missing = [b for b in harness.requires if shutil.which(b) is None]
        if missing:
            problems.append(
                f"harness {name}: {', '.join(missing)} not on PATH "
                "(run ./dev/install-harnesses; it installs into .tools/bin)"
            )
        else:
            found = ", ".join(f"{b} at {shutil.which(b)}" for b in harness.requires)
            print(f"preflight: harness {name}: {found or 'needs no binary'}", file=sys.stderr)
    for problem in problems:
        print(f"preflight: MISSING: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
