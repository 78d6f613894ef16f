"""Reference solution of expenses-by-category (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
import json

tot = {}
for r in csv.DictReader(open("expenses.csv")):
    tot[r["category"]] = tot.get(r["category"], 0) + float(r["amount"])
out = {k: round(v, 2) for k, v in tot.items()}
out["_all"] = round(sum(tot.values()), 2)
json.dump(out, open("totals.json", "w"), indent=2)
