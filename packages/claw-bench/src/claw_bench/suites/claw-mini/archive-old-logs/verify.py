"""Verifier of task archive-old-logs: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

import csv
import io
import json
import os
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


OLD = ["app-2023-12-31.log", "app-2024-01-01.log", "app-2024-01-02.log", "app-2024-01-03.log", "app-2024-01-04.log"]
NEW = ["app-2024-01-05.log", "app-2024-01-06.log", "app-2024-01-07.log"]


check("archived", lambda: files("logs/archive") == sorted(OLD + ["INDEX.txt"]))
check("recent_kept", lambda: sorted(p.name for p in Path("logs").iterdir() if p.is_file()) == NEW)
check("index", lambda: text("logs/archive/INDEX.txt").split() == OLD)
check("contents", lambda: text("logs/archive/app-2024-01-03.log") == "day 3\n" and text("logs/app-2024-01-06.log") == "day 6\n")


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
