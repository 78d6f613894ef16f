"""Reference solution of iso-dates-in-csv (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

lines = open("invoices.csv").read().splitlines()
out = [lines[0]]
for line in lines[1:]:
    inv, date, amount = line.split(",")
    d, m, y = date.split("/")
    out.append(f"{inv},{y}-{m}-{d},{amount}")
open("invoices.csv", "w").write("\n".join(out) + "\n")
