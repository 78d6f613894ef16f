"""Reference solution of flatten-nested-dirs (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

from pathlib import Path

Path("flat").mkdir(exist_ok=True)
for p in Path("project").rglob("*"):
    if p.is_file():
        rel = p.relative_to("project").as_posix().replace("/", "__")
        (Path("flat") / rel).write_bytes(p.read_bytes())
