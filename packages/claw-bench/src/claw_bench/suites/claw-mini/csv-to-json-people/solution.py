"""Reference solution of csv-to-json-people (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
import json

out = [{"name": r["name"], "age": int(r["age"]), "email": r["email"] or None}
       for r in csv.DictReader(open("people.csv"))]
json.dump(out, open("people.json", "w"), indent=2)
