"""Reference solution of merge-todo-lists (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import re

items = {}
for f in ("todo_home.md", "todo_work.md"):
    for line in open(f):
        m = re.match(r"- \[( |x)\] (.*)", line)
        if m:
            key = m[2].strip().lower()
            done, label = items.get(key, (False, m[2].strip()))
            items[key] = (done or m[1] == "x", label)
out = ["# TODO"] + [f"- [{'x' if d else ' '}] {label}" for k, (d, label) in sorted(items.items())]
open("todo.md", "w").write("\n".join(out) + "\n")
