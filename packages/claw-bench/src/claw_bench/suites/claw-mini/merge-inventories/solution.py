"""Reference solution of merge-inventories (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json

tot = {}
for f in ("north.json", "south.json"):
    for k, v in json.load(open(f)).items():
        tot[k] = tot.get(k, 0) + v
json.dump(tot, open("inventory.json", "w"), indent=2, sort_keys=True)
open("low_stock.txt", "w").write("".join(k + "\n" for k in sorted(tot) if tot[k] < 10))
