"""Verifier of task mail-triage: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

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


EXPECT = [["001.eml", "billing@bank.example", "Your statement", "finance"],
          ["002.eml", "boss@corp.example", "Q3 plan", "work"],
          ["003.eml", "news@shop.example", "Sale, today only", "other"],
          ["004.eml", "ana@corp.example", "lunch?", "work"]]


check("layout", lambda: files("mail") == ["finance/001.eml", "other/003.eml", "work/002.eml", "work/004.eml"])
check("contents_kept", lambda: text("mail/work/004.eml").endswith("12:30\n"))
check("header", lambda: text("triage.csv").splitlines()[0].strip() == "file,from,subject,folder")
check("rows", lambda: list(csv.reader(io.StringIO(text("triage.csv"))))[1:] == EXPECT)


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
