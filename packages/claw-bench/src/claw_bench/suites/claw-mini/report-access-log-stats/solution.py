"""Reference solution of report-access-log-stats (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import json
import re
from collections import Counter

ips, status, paths, total, n = set(), Counter(), Counter(), 0, 0
for line in open("access.log"):
    m = re.match(r'(\S+) \S+ \S+ \[.*?\] "\S+ (\S+) [^"]*" (\d+) (\S+)', line)
    n += 1
    ips.add(m[1])
    paths[m[2]] += 1
    status[m[3]] += 1
    total += 0 if m[4] == "-" else int(m[4])
top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
json.dump({"requests": n, "unique_ips": len(ips), "status_counts": dict(status), "top_path": top, "bytes": total},
          open("stats.json", "w"), indent=2)
