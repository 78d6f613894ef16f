"""Reference solution of report-top-words (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import re
from collections import Counter

stop = set(open("stopwords.txt").read().split())
c = Counter(w for w in re.findall(r"[a-z]+", open("speech.txt").read().lower()) if w not in stop)
top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
open("top_words.txt", "w").write("".join(f"{w} {n}\n" for w, n in top))
