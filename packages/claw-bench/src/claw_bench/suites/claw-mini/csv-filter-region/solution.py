"""Reference solution of csv-filter-region (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

lines = open("sales.csv").read().splitlines()
keep = [lines[0]] + [line for line in lines[1:] if line.split(",")[1] == "EU"]
open("eu_sales.csv", "w").write("\n".join(keep) + "\n")
