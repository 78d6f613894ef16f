"""`claw-tree samples` at corpus scale: time and peak memory at 1x, 10x and 100x the demo corpus.

The demo corpus is one GRPO group of 8 Claude Code-shaped rollouts (148 calls, 1.57M flat
tokens: prompt + completion summed over calls), kx is k groups of one harness
(bench/tree_memory.py writes them once under the temp directory; 100x is 15,027 calls, 161M
flat tokens, 760 MB of JSONL). Each row runs the CLI in a fresh interpreter and reports its peak
RSS over that of an interpreter that only imported claw_tree, per flat token.

Goal (issue 30): at most about 20 bytes per flat token, or streaming so that 10M calls fit in a
few GB. `claw-tree samples calls.jsonl` indexes the file and builds one unit (about 8M flat
tokens of whole sessions, groups or harness buckets) at a time, so its peak is that of a unit
plus the index (about 30 bytes a call), not the corpus's: held to PEAK_MB at 10x and 100x,
and over a corpus of many small sessions at 100K and 1M calls (bench/tree_memory.py --small).
`--pack batch` needs `--max-tokens` for that (without a budget one harness's whole batch is one
sample, as large as the corpus's tree). 1x is reported, not held.

Run: .venvs/claw-tree/bin/python -m pytest bench/test_tree_memory.py --benchmark-only -s
(100x and 1M calls take several minutes: `-m slow` runs them, `-m "not slow"` leaves them out).
"""

from __future__ import annotations

import pytest
import tree_memory  # bench/ is on pytest's pythonpath (root pyproject.toml)

GOAL = 20.0  # bytes per flat token over the interpreter's baseline
PEAK_MB = 400.0  # over the baseline: the largest unit and the index, whatever the corpus's size
CASES = [
    pytest.param(k, pack, budget, id=f"{k}x-{pack}{'-' + str(budget) if budget else ''}", marks=m)
    for k, m in ((1, ()), (10, ()), (100, pytest.mark.slow))
    for pack, budget in (("session", None), ("group", None), ("batch", 131072))
]


@pytest.mark.parametrize(("k", "pack", "budget"), CASES)
def test_samples_memory(benchmark, k, pack, budget):
    """Wall time and peak RSS of `claw-tree samples --pack PACK` over the kx corpus."""
    try:
        tree_memory.shapes.profile("claude-code")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    tree_memory.write_corpus(k, tree_memory.DEFAULT_DIR)  # not timed
    row = benchmark.pedantic(
        tree_memory.measure,
        args=(k,),
        kwargs=dict(pack=pack, max_tokens=budget),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(row)
    print(f"\n{row}")
    if k >= 10:
        assert row["bytes_per_flat_token"] <= GOAL, row
        assert row["peak_mb"] - row["baseline_mb"] <= PEAK_MB, row


@pytest.mark.parametrize(
    "n", [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)], ids=lambda n: f"{n}calls"
)
def test_many_small_sessions_memory_is_flat(benchmark, n):
    """Peak RSS of `claw-tree samples calls.jsonl` over n calls in sessions of 10 (about 80
    tokens a call): a unit at a time, so 10x the calls stay under PEAK_MB."""
    tree_memory.write_small_corpus(n, tree_memory.DEFAULT_DIR)  # not timed
    row = benchmark.pedantic(
        tree_memory.measure, args=(n,), kwargs=dict(small=True), rounds=1, iterations=1
    )
    benchmark.extra_info.update(row)
    print(f"\n{row}")
    assert row["peak_mb"] - row["baseline_mb"] <= PEAK_MB, row
