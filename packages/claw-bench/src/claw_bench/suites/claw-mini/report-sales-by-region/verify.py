"""Verifier of task report-sales-by-region: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

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


R = text("report.md")
TABLE = [[c.strip() for c in x.strip().strip("|").split("|")] for x in R.splitlines() if x.strip().startswith("|")]


check("title", lambda: R.strip().splitlines()[0].strip() == "# Sales report")
check("header", lambda: TABLE[0] == ["region", "orders", "revenue"] and set(TABLE[1][0]) <= set("-: "))
check("rows", lambda: TABLE[2:] == [["US", "2", "251.00"], ["EU", "3", "150.25"], ["APAC", "1", "75.00"]])
check("total", lambda: R.strip().splitlines()[-1].strip() == "Total revenue: 476.25")


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
