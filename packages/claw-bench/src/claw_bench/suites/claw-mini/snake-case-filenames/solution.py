"""Reference solution of snake-case-filenames (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import re
from pathlib import Path

for p in list(Path("docs").iterdir()):
    stem = re.sub(r"[ -]+", "_", p.stem.lower())
    p.rename(p.with_name(stem + p.suffix.lower()))
