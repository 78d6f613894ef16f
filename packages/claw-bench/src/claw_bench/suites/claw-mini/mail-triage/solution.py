"""Reference solution of mail-triage (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv
import json
import re
from pathlib import Path

rules = json.loads(Path("rules.json").read_text())
rows = []
for p in sorted(Path("mail").glob("*.eml")):
    t = p.read_text()
    frm = re.search(r"^From: (.*)$", t, re.M)[1]
    addr = re.search(r"[\w.+-]+@[\w.-]+", frm)[0]
    subj = re.search(r"^Subject: (.*)$", t, re.M)[1]
    folder = rules.get(addr.split("@")[1], "other")
    (Path("mail") / folder).mkdir(exist_ok=True)
    p.rename(Path("mail") / folder / p.name)
    rows.append([p.name, addr, subj, folder])
with open("triage.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["file", "from", "subject", "folder"])
    w.writerows(rows)
