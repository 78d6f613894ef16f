"""Verifier of task invoice-pipeline: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

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


EXPECT = [["acme", "2", "171.00"], ["globex", "1", "95.00"], ["initech", "1", "0.00"]]


check("summary_header", lambda: text("summary.csv").splitlines()[0].strip() == "customer,invoices,total_eur")
check("summary_rows", lambda: list(csv.reader(io.StringIO(text("summary.csv"))))[1:] == EXPECT)
check("errors", lambda: text("errors.txt").split() == ["inv-004.json", "inv-005.json"])
check("processed", lambda: files("processed") == ["inv-001.json", "inv-002.json", "inv-003.json", "inv-006.json"])
check("invalid_left", lambda: files("invoices") == ["inv-004.json", "inv-005.json"])
check("contents_kept", lambda: json.loads(text("processed/inv-003.json"))["lines"] == [{"qty": 3, "unit_price": 20}])


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
