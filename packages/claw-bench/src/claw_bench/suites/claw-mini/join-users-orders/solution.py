"""Reference solution of join-users-orders (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

users = {r["user_id"]: r["name"] for r in csv.DictReader(open("users.csv"))}
agg = {u: [0, 0.0] for u in users}
for r in csv.DictReader(open("orders.csv")):
    if r["user_id"] in agg:
        agg[r["user_id"]][0] += 1
        agg[r["user_id"]][1] += float(r["amount"])
rows = sorted(agg.items(), key=lambda kv: (-round(kv[1][1], 2), int(kv[0])))
out = ["user_id,name,order_count,total_spent"] + [f"{u},{users[u]},{c},{t:.2f}" for u, (c, t) in rows]
open("user_orders.csv", "w").write("\n".join(out) + "\n")
