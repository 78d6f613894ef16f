"""Verifier of task release-bump: checks the final workspace; writes named sub-scores to $CLAW_REWARD_FILE."""

import csv
import io
import json
import os
import re
import sys
import tomllib
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


C = text("CHANGELOG.md")
SECTIONS = re.split(r"^## ", C, flags=re.M)


check("pyproject", lambda: tomllib.loads(text("pyproject.toml"))["project"]["version"] == "0.5.0")
check("init", lambda: re.search(r"^__version__ = ['\"]0\.5\.0['\"]$", text("src/tinylib/__init__.py"), re.M))
check("changelog_order", lambda: [s.splitlines()[0].strip() for s in SECTIONS[1:]] == ["[Unreleased]", "[0.5.0] - 2024-07-01", "[0.4.2] - 2024-05-01"])
check("unreleased_empty", lambda: [x for x in SECTIONS[1].splitlines()[1:] if x.strip()] == [])
check("release_bullets", lambda: [x for x in SECTIONS[2].splitlines()[1:] if x.strip()] == ["- faster parsing", "- new `tinylib.io` module", "- drop Python 3.8"])
check("old_kept", lambda: SECTIONS[3].splitlines()[1:2] == ["- bug fixes"])
check("readme", lambda: "pip install tinylib==0.5.0" in text("README.md") and "0.4.2" not in text("README.md"))


out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
for name, value in SCORES.items():
    print("PASS" if value else "FAIL", name)
sys.exit(0 if SCORES and all(SCORES.values()) else 1)
