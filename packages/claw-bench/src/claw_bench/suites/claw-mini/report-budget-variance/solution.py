"""Reference solution of report-budget-variance (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
import json

act = {}
for r in csv.DictReader(open("actuals.csv")):
    act[r["department"]] = act.get(r["department"], 0) + float(r["amount"])
rows, over = ["department,budget,actual,variance,status"], []
for r in csv.DictReader(open("budget.csv")):
    b, a = float(r["budget"]), act.get(r["department"], 0.0)
    st = "over" if a > b else "ok"
    if st == "over":
        over.append(r["department"])
    rows.append(f"{r['department']},{b:.2f},{a:.2f},{b - a:.2f},{st}")
open("variance.csv", "w").write("\n".join(rows) + "\n")
json.dump(over, open("over_budget.json", "w"))
