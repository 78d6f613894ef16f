"""Reference solution of dedupe-records-latest (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json

best = {}
for line in open("records.jsonl"):
    r = json.loads(line)
    if r["id"] not in best or r["updated"] > best[r["id"]]["updated"]:
        best[r["id"]] = r
open("deduped.jsonl", "w").write("".join(json.dumps(best[k]) + "\n" for k in sorted(best)))
