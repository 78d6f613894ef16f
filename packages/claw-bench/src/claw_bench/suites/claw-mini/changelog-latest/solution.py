"""Reference solution of changelog-latest (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json
import re

t = open("CHANGELOG.md").read()
m = re.search(r"## \[(\d+\.\d+\.\d+)\] - (\S+)\n(.*?)(?=\n## |\Z)", t, re.S)
n = sum(1 for line in m[3].splitlines() if line.startswith("- "))
json.dump({"version": m[1], "date": m[2], "changes": n}, open("latest.json", "w"))
