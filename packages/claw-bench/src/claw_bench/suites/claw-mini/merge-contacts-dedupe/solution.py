"""Reference solution of merge-contacts-dedupe (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

people = {}
for r in csv.DictReader(open("contacts_a.csv")):
    people[r["email"].lower()] = {"name": r["name"], "phone": r["phone"]}
for r in csv.DictReader(open("contacts_b.csv")):
    p = people.setdefault(r["email"].lower(), {"name": r["name"], "phone": ""})
    if r["phone"]:
        p["phone"] = r["phone"]
with open("contacts.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["email", "name", "phone"])
    for e in sorted(people):
        w.writerow([e, people[e]["name"], people[e]["phone"]])
