"""The verifier reward file, read one way everywhere in claw-bench (score, check, regrade)."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["parse_reward"]


def parse_reward(text: str) -> tuple[float | None, dict[str, float]]:
    """A verifier reward file (docs/formats.md, Verifier reward file): a number in [0, 1], or a
    non-empty JSON object of named sub-scores in [0, 1] whose mean is the reward.

    Returns (reward, sub-scores), or (None, {}) for anything else (the caller falls back to the
    verifier's exit code). The same rules as claw-sandbox's parser, held to
    formats/conformance/reward-file.jsonl.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return None, {}

    def unit(x: Any) -> bool:
        return (
            isinstance(x, int | float)
            and not isinstance(x, bool)
            and math.isfinite(x)
            and 0 <= x <= 1
        )

    if unit(value):
        return float(value), {}
    if isinstance(value, dict) and value and all(unit(v) for v in value.values()):
        subs = {k: float(v) for k, v in value.items()}
        return sum(subs.values()) / len(subs), subs
    return None, {}
