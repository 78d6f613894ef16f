"""Reference solution of archive-old-logs (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

from pathlib import Path

arch = Path("logs/archive")
arch.mkdir(exist_ok=True)
moved = []
for p in sorted(Path("logs").glob("app-*.log")):
    if p.stem[4:] < "2024-01-05":
        p.rename(arch / p.name)
        moved.append(p.name)
(arch / "INDEX.txt").write_text("".join(m + "\n" for m in moved))
