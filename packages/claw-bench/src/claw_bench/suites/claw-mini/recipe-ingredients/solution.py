"""Reference solution of recipe-ingredients (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json
from fractions import Fraction

section, out = None, []
for line in open("recipe.md"):
    if line.startswith("## "):
        section = line.strip()
    elif section == "## Ingredients" and line.startswith("- "):
        parts = line[2:].split()
        q = float(Fraction(parts[0]))
        q = int(q) if q.is_integer() else q
        if len(parts) == 3:
            out.append({"item": parts[2], "qty": q, "unit": parts[1]})
        else:
            out.append({"item": parts[1], "qty": q, "unit": None})
json.dump(out, open("ingredients.json", "w"), indent=2)
