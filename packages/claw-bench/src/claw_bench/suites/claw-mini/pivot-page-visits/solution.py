"""Reference solution of pivot-page-visits (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import csv

data, dates, pages = {}, set(), set()
for r in csv.DictReader(open("visits.csv")):
    dates.add(r["date"])
    pages.add(r["page"])
    data[(r["page"], r["date"])] = data.get((r["page"], r["date"]), 0) + int(r["count"])
dates = sorted(dates)
with open("pivot.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["page", *dates])
    for p in sorted(pages):
        w.writerow([p, *[data.get((p, d), 0) for d in dates]])
