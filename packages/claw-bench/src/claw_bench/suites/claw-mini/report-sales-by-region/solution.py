"""Reference solution of report-sales-by-region (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

agg = {}
for r in csv.DictReader(open("sales.csv")):
    n, t = agg.get(r["region"], (0, 0.0))
    agg[r["region"]] = (n + 1, t + float(r["revenue"]))
lines = ["# Sales report", "", "| region | orders | revenue |", "|---|---|---|"]
for reg, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    lines.append(f"| {reg} | {n} | {t:.2f} |")
lines += ["", f"Total revenue: {sum(t for _, t in agg.values()):.2f}"]
open("report.md", "w").write("\n".join(lines) + "\n")
