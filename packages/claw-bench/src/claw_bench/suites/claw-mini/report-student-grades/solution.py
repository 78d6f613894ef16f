"""Reference solution of report-student-grades (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

s = {}
for r in csv.DictReader(open("grades.csv")):
    s.setdefault(r["student"], []).append(float(r["score"]))
def letter(a):
    return "A" if a >= 90 else "B" if a >= 80 else "C" if a >= 70 else "D" if a >= 60 else "F"
out = [f"{n}: {sum(v) / len(v):.1f} {letter(sum(v) / len(v))}" for n, v in sorted(s.items())]
open("summary.txt", "w").write("\n".join(out) + "\n")
