"""Reference solution of json-to-csv-orders (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json

orders = sorted(json.load(open("orders.json")), key=lambda o: o["id"])
lines = ["id,customer,total"]
for o in orders:
    total = sum(i["qty"] * i["price"] for i in o["items"])
    lines.append(f"{o['id']},{o['customer']},{total:.2f}")
open("orders.csv", "w").write("\n".join(lines) + "\n")
