"""Verifier of toy task toy-digits: dense credit for how much of the answer is digits.

Every answer gets a different score (the share of its non-space characters that are digits),
which gives group-relative RL a signal from the very first step even with a random model.
Writes named sub-scores in [0, 1] to $CLAW_REWARD_FILE (the reward is their mean) and exits 0
when the reward reaches the task's pass threshold (0.9).
"""

import json
import os
import sys
from pathlib import Path

path = Path("answer.txt")
answer = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
chars = [c for c in answer if not c.isspace()]
digits = sum(c in "0123456789" for c in chars)

SCORES = {
    "answered": 1.0 if chars else 0.0,
    "digit_share": digits / len(chars) if chars else 0.0,
}

out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(SCORES))
reward = sum(SCORES.values()) / len(SCORES)
print(f"answer={answer[:80]!r} reward={reward:.3f} scores={SCORES}")
sys.exit(0 if reward >= 0.9 else 1)
