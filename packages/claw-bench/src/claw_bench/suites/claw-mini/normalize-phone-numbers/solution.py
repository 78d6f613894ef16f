"""Reference solution of normalize-phone-numbers (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json
import re

out = {}
for line in open("directory.txt"):
    name, num = line.split(":", 1)
    d = re.sub(r"\D", "", num)[-10:]
    out[name.strip()] = f"+1-{d[:3]}-{d[3:6]}-{d[6:]}"
json.dump(out, open("phones.json", "w"), indent=2)
