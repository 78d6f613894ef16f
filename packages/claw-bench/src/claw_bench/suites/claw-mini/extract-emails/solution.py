"""Reference solution of extract-emails (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import re
from pathlib import Path

found = set()
for p in Path("notes").rglob("*.txt"):
    found |= {m.lower() for m in re.findall(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", p.read_text())}
open("emails.txt", "w").write("".join(e + "\n" for e in sorted(found)))
