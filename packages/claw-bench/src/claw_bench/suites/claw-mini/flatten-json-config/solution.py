"""Reference solution of flatten-json-config (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json


def flat(obj, prefix=""):
    out = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out
json.dump(flat(json.load(open("config.json"))), open("flat.json", "w"), indent=2)
