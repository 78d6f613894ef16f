"""Verifier of task crontab-reschedule: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

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


L = [x for x in text("crontab.txt").splitlines() if x.strip()]
JOBS = [x.split(None, 5) for x in L if not x.startswith("#") and "=" not in x.split()[0]]


check("backup", lambda: ["30", "2", "*", "*", "*", "/opt/bin/backup.sh --full"] in JOBS)
check("cleanup_commented", lambda: "# 0 4 * * 0 /opt/bin/cleanup.sh" in L and not any("cleanup.sh" in j[-1] for j in JOBS))
check("report", lambda: ["0", "7", "*", "*", "1", "/opt/bin/report.sh"] in JOBS)
check("others_kept", lambda: "MAILTO=ops@example.org" in L and "*/15 * * * * /opt/bin/poll.sh" in L and len(JOBS) == 3)


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
