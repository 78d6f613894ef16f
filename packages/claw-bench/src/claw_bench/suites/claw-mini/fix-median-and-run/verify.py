"""Verifier of task fix-median-and-run: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

SCORES = {}


def check(name, fn):
    """Record sub-score `name`: 1.0 when fn() is truthy; a crash in fn is a failed check."""
    try:
        ok = bool(fn())
    except Exception as exc:
        print(f"  {name}: {type(exc).__name__}: {exc}")
        ok = False
    SCORES[name] = 1.0 if ok else 0.0


def text(p):
    return Path(p).read_text(encoding="utf-8")


def rows(p):
    return list(csv.DictReader(io.StringIO(text(p))))


def files(d):
    return sorted(q.relative_to(d).as_posix() for q in Path(d).rglob("*") if q.is_file())


def hidden_test(name):
    path = os.path.join(os.environ.get("CLAW_VERIFY_DIR", ".claw_verify"), name)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=30, env=env)
    print(p.stdout[-1500:] + p.stderr[-1500:])
    # the last line must be the hidden test's own sentinel: a module that exits early cannot fake it
    return p.returncode == 0 and p.stdout.rstrip().endswith("claw-hidden-tests-passed-5e1f")


check("hidden_tests", lambda: hidden_test("hidden_test.py"))
check("output", lambda: json.loads(text("out/stats.json")) == {"n": 6, "mean": 4.5, "median": 3.5, "max": 10.0})


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
