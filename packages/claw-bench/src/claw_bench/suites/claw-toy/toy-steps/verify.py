"""Verifier of the toy-steps family: strict, reward 1 only for exactly the expected file.

The instance's expected output lies in $CLAW_VERIFY_DIR/expected.json as {"path", "content"}.
The file at `path` must hold exactly `content` (one trailing newline allowed); anything else,
a missing file included, is reward 0. Writes {"exact": 0 or 1} to $CLAW_REWARD_FILE and exits 0
on pass.
"""

import json
import os
import sys
from pathlib import Path

expected = json.loads(
    (Path(os.environ.get("CLAW_VERIFY_DIR", ".claw_verify")) / "expected.json").read_text()
)
target = Path(expected["path"])
got = target.read_text(encoding="utf-8", errors="replace") if target.is_file() else None
exact = got is not None and got.removesuffix("\n") == expected["content"]

out = Path(os.environ.get("CLAW_REWARD_FILE", ".claw_verify/reward.json"))
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"exact": 1.0 if exact else 0.0}))
print(f"{expected['path']}: {got if got is None else got[:80]!r}, want {expected['content']!r}")
sys.exit(0 if exact else 1)
