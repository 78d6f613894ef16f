"""Reference solution of release-bump (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

from pathlib import Path

for f in ("pyproject.toml", "src/tinylib/__init__.py", "README.md"):
    p = Path(f)
    p.write_text(p.read_text().replace("0.4.2", "0.5.0"))
notes = [x for x in Path("notes/changes.txt").read_text().splitlines() if x.strip()]
c = Path("CHANGELOG.md").read_text()
head, rest = c.split("## [Unreleased]\n", 1)
body, tail = rest.split("\n## [0.4.2]", 1)
bullets = [x for x in body.splitlines() if x.strip()] + [f"- {n}" for n in notes]
c = head + "## [Unreleased]\n\n## [0.5.0] - 2024-07-01\n" + "\n".join(bullets) + "\n\n## [0.4.2]" + tail
Path("CHANGELOG.md").write_text(c)
