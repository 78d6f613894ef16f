"""Reference solution of collect-todos-csv (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
from pathlib import Path

rows = []
for p in sorted(Path("src").rglob("*")):
    if p.is_file():
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if "TODO:" in line:
                rows.append([p.as_posix(), i, line.split("TODO:", 1)[1].strip()])
with open("todos.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["file", "line", "text"])
    w.writerows(sorted(rows))
