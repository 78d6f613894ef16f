"""Peak memory and time of `claw-tree samples` over corpora 1x, 10x and 100x the demo's.

The demo corpus is one GRPO group of 8 Claude Code-shaped rollouts (bench/harness_shapes.py at
full size: compaction, a sub-agent, 2 side calls; 148 calls, 1.57M flat tokens); kx is k such
groups of one harness (task0 ... task{k-1}, the harness's system prompt and tools shared).
``--small``: the sizes are numbers of calls of a corpus of many small sessions instead (10 calls
of about 80 tokens each, groups of 8): what grows there is the number of calls and sessions,
so it measures what the index keeps per call. The corpus is written once as calls.jsonl +
outcomes.jsonl under a cache directory; each measurement runs the CLI in a fresh interpreter
and reads its peak RSS (``ru_maxrss``) at exit, next to the peak RSS of an interpreter that
only imported claw_tree (the baseline). ``--stdin`` pipes the calls in (the CLI then builds
the whole forest in memory, as before the calls file was indexed).

    python bench/tree_memory.py 1 10 100 [--pack session|group|batch] [--max-tokens N] [--dir D]
    python bench/tree_memory.py --small 100000 1000000 [--stdin]

prints one JSON line per size: calls, flat_tokens, seconds, peak_mb, baseline_mb,
bytes_per_flat_token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness_shapes as shapes

GROUP = 8
DEFAULT_DIR = Path(tempfile.gettempdir()) / "claw-tree-corpus"

_CHILD = """
import resource, sys
from claw_tree.cli import main
if sys.argv[1:]:
    try:
        main(sys.argv[1:], standalone_mode=False)
    finally:
        print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
else:
    print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def write_corpus(k: int, where: Path) -> dict:
    """calls.jsonl + outcomes.jsonl of ``k`` groups under ``where/<k>x`` (once); their sizes."""
    out = where / f"{k}x"
    meta = out / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text())
    out.mkdir(parents=True, exist_ok=True)
    prof = shapes.profile("claude-code")
    base = shapes._shared(prof, 1.0, 4000)
    calls = flat = 0
    with (out / "calls.tmp").open("w") as fc, (out / "outcomes.jsonl").open("w") as fo:
        for t in range(k):
            own = shapes._Ids(shapes.random.Random(f"task-{t}-4000"), 4000)(
                len(base["first_messages"])
            )
            shared = {**base, "first_messages": own}
            rows, outcomes = shapes.group(f"task{t}", GROUP, prof, seed=t, shared=shared)
            for row in rows:
                fc.write(json.dumps(row, separators=(",", ":")) + "\n")
                flat += len(row["prompt_ids"]) + len(row["completion_ids"])
            calls += len(rows)
            fo.writelines(json.dumps(o) + "\n" for o in outcomes)
    (out / "calls.tmp").rename(out / "calls.jsonl")
    info = {"groups": k, "calls": calls, "flat_tokens": flat}
    meta.write_text(json.dumps(info))
    return info


SMALL_SESSION = 10  # calls per session of the small corpus


def write_small_corpus(n_calls: int, where: Path) -> dict:
    """``n_calls`` calls in sessions of 10 (a 24-token system prompt, an 8-token instruction,
    then 6 generated and 4 tool tokens a turn), groups of 8, under ``where/small-<n_calls>``."""
    out = where / f"small-{n_calls}"
    meta = out / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text())
    out.mkdir(parents=True, exist_ok=True)
    rng = shapes.random.Random(0)
    ids = shapes._Ids(rng, 32000)
    system = ids(24)
    flat = 0
    with (out / "calls.tmp").open("w") as fc, (out / "outcomes.jsonl").open("w") as fo:
        for s in range(n_calls // SMALL_SESSION):
            session, task = f"s{s:07d}", f"task{s // GROUP}"
            history = system + ids(8)
            for seq in range(SMALL_SESSION):
                completion = ids(6)
                row = shapes._call(session, seq, history, completion, "policy")
                fc.write(json.dumps(row, separators=(",", ":")) + "\n")
                flat += len(history) + len(completion)
                history = history + completion + ids(4)
            reward = float(rng.random() < 0.5)
            oc = {"schema": "claw.outcome/v1", "session": session, "task": task, "harness": "h"}
            oc |= {"group": task, "reward": reward, "passed": reward == 1.0, "status": "ok"}
            fo.write(json.dumps(oc) + "\n")
    (out / "calls.tmp").rename(out / "calls.jsonl")
    calls = n_calls // SMALL_SESSION * SMALL_SESSION
    info = {"sessions": calls // SMALL_SESSION, "calls": calls, "flat_tokens": flat}
    meta.write_text(json.dumps(info))
    return info


def peak_kb(args: list[str], stdin: Path | None = None) -> tuple[int, float]:
    """Peak RSS (kB) and wall seconds of ``claw-tree ARGS`` in a fresh interpreter (``stdin``:
    a file piped in)."""
    start = time.perf_counter()
    with open(stdin or os.devnull, "rb") as fin:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, *args],
            stdin=fin,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"claw-tree {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    line = next(x for x in proc.stderr.splitlines() if x.startswith("PEAK_KB"))
    return int(line.split()[1]), seconds


def measure(
    k: int,
    where: Path = DEFAULT_DIR,
    pack: str = "session",
    max_tokens: int | None = None,
    *,
    small: bool = False,
    stdin: bool = False,
) -> dict:
    """One row: the corpus's sizes, the CLI's time and peak RSS over the baseline (``small``:
    ``k`` calls of small sessions; ``stdin``: calls piped in, the forest built whole)."""
    info = write_small_corpus(k, where) if small else write_corpus(k, where)
    d = where / (f"small-{k}" if small else f"{k}x")
    base_kb, _ = peak_kb([])
    calls = "-" if stdin else str(d / "calls.jsonl")
    args = ["samples", calls, str(d / "outcomes.jsonl"), "--pack", pack]
    if max_tokens:
        args += ["--max-tokens", str(max_tokens)]
    args += ["-o", str(d / f"samples-{pack}{max_tokens or ''}{'-stdin' if stdin else ''}.jsonl")]
    kb, seconds = peak_kb(args, d / "calls.jsonl" if stdin else None)
    return {
        **info,
        "pack": pack,
        "max_tokens": max_tokens,
        "input": "stdin" if stdin else "file",
        "seconds": round(seconds, 2),
        "peak_mb": round(kb / 1024, 1),
        "baseline_mb": round(base_kb / 1024, 1),
        "bytes_per_flat_token": round((kb - base_kb) * 1024 / info["flat_tokens"], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sizes", nargs="+", type=int, help="corpus sizes, in demo corpora")
    p.add_argument("--pack", default="session", choices=["session", "group", "batch"])
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--small", action="store_true", help="sizes are calls of small sessions")
    p.add_argument("--stdin", action="store_true", help="pipe the calls in (forest built whole)")
    a = p.parse_args()
    for k in a.sizes:
        row = measure(k, a.dir, a.pack, a.max_tokens, small=a.small, stdin=a.stdin)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
