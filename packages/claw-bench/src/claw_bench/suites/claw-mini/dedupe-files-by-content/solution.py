"""Reference solution of dedupe-files-by-content (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

from pathlib import Path

seen, lines = {}, []
for p in sorted(Path("downloads").iterdir(), key=lambda q: q.name):
    data = p.read_bytes()
    if data in seen:
        lines.append(f"{p.name} -> {seen[data]}")
        p.unlink()
    else:
        seen[data] = p.name
Path("duplicates.txt").write_text("".join(x + "\n" for x in sorted(lines)))
