"""Reference solution of pyproject-bump-version (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

t = open("pyproject.toml").read()
t = t.replace('version = "1.2.3"', 'version = "1.3.0"')
t = t.replace('    "attrs>=23",\n', '    "attrs>=23",\n    "requests>=2.31",\n')
t = t.replace('3.11",\n', '3.11",\n    "Programming Language :: Python :: 3.12",\n')
open("pyproject.toml", "w").write(t)
