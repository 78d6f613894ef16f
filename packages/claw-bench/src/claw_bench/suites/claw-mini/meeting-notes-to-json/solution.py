"""Reference solution of meeting-notes-to-json (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json
import re

t = open("notes/meeting.md").read()
att = sorted(x.strip() for x in re.search(r"Attendees: (.*)", t)[1].split(","))
dec = re.findall(r"- DECISION: (.*)", t)
acts = [{"owner": o, "task": k, "due": d} for o, d, k in re.findall(r"- ACTION \((\w+), due ([\d-]+)\): (.*)", t)]
json.dump({"date": "2024-03-07", "attendees": att, "decisions": dec, "action_items": acts}, open("meeting.json", "w"), indent=2)
