"""Reference solution of rename-photos-iso-dates (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import re
from pathlib import Path

for p in Path("photos").iterdir():
    m = re.fullmatch(r"IMG_(\d\d)-(\d\d)-(\d{4})_(\d+)\.txt", p.name)
    if m:
        p.rename(p.with_name(f"{m[3]}-{m[1]}-{m[2]}_{m[4]}.txt"))
