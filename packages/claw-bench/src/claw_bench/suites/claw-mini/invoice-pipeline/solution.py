"""Reference solution of invoice-pipeline (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
import json
from pathlib import Path

rates = {r["currency"]: float(r["eur"]) for r in csv.DictReader(open("rates.csv"))}
agg, errors = {}, []
Path("processed").mkdir(exist_ok=True)
for p in sorted(Path("invoices").glob("*.json")):
    inv = json.loads(p.read_text())
    if "customer" not in inv or inv.get("currency") not in rates:
        errors.append(p.name)
        continue
    total = sum(x["qty"] * x["unit_price"] for x in inv["lines"]) * rates[inv["currency"]]
    n, t = agg.get(inv["customer"], (0, 0.0))
    agg[inv["customer"]] = (n + 1, t + total)
    p.rename(Path("processed") / p.name)
rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
Path("summary.csv").write_text("customer,invoices,total_eur\n" + "".join(f"{c},{n},{t:.2f}\n" for c, (n, t) in rows))
Path("errors.txt").write_text("".join(e + "\n" for e in errors))
