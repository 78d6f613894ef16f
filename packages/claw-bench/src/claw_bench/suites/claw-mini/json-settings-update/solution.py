"""Reference solution of json-settings-update (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json

s = json.load(open("settings.json"))
s["version"] = 2
s["features"] = {"dark_mode": True, "beta": False}
del s["legacy_mode"]
s["languages"].append("fr")
json.dump(s, open("settings.json", "w"), indent=2)
