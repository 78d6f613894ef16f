"""Reference solution of fix-csv-quoted-fields (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

open("report.py", "w").write('''import csv


def totals(path):
    out = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            out[row["customer"]] = out.get(row["customer"], 0) + float(row["amount"])
    return out
''')
