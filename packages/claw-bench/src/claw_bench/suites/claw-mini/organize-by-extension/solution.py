"""Reference solution of organize-by-extension (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

from pathlib import Path

for p in sorted(Path("inbox").iterdir()):
    dest = Path("sorted") / p.suffix.lstrip(".").lower() / p.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    p.rename(dest)
