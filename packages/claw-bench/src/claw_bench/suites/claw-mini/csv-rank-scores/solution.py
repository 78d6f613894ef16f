"""Reference solution of csv-rank-scores (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

rows = sorted(csv.DictReader(open("scores.csv")), key=lambda r: (-int(r["score"]), r["name"]))
prev = 0
out = ["rank,name,score"]
for i, r in enumerate(rows):
    rank = i + 1
    if i and rows[i - 1]["score"] == r["score"]:
        rank = prev
    prev = rank
    out.append(f"{rank},{r['name']},{r['score']}")
open("ranked.csv", "w").write("\n".join(out) + "\n")
