"""Verifier of toy task toy-yes: shaped credit for the agent's final answer in answer.txt.

Writes named sub-scores in [0, 1] to $CLAW_REWARD_FILE (the reward is their mean) and exits 0
when the reward reaches the task's pass threshold (1.0).
"""

import json
import os
import sys
from pathlib import Path

TARGET = 'yes'
path = Path("answer.txt")
answer = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
a = answer.strip().lower()


def prefix_fraction(s, target):
    """Fraction of `target` matched as a prefix of `s` (shaped credit, 0..1)."""
    n = 0
    while n < min(len(s), len(target)) and s[n] == target[n]:
        n += 1
    return n / len(target)


SCORES = {
    "answered": 1.0 if a else 0.0,
    "prefix": prefix_fraction(a, TARGET),
    "exact": 1.0 if a.rstrip(".!") == TARGET else 0.0,
}

out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
reward = sum(SCORES.values()) / len(SCORES)
print(f"answer={answer[:80]!r} reward={reward:.3f} scores={SCORES}")
sys.exit(0 if reward >= 1.0 else 1)
