"""Reference solution of jsonl-error-events (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json

keep = [line for line in open("events.jsonl") if line.strip() and json.loads(line)["level"].lower() == "error"]
open("errors.jsonl", "w").write("".join(keep))
open("error_count.txt", "w").write(f"{len(keep)}\n")
