"""Reference solution of fix-median-and-run (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import subprocess
import sys
from pathlib import Path

p = Path("stats.py")
p.write_text(p.read_text().replace(
    "def median(xs):\n    return xs[len(xs) // 2]\n",
    "def median(xs):\n    s = sorted(xs)\n    m = len(s) // 2\n    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2\n"))
Path("out").mkdir(exist_ok=True)
subprocess.run([sys.executable, "stats.py", "data.txt", "out/stats.json"], check=True)
