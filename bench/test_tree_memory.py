"""`claw-tree samples` at corpus scale: time and peak memory at 1x, 10x and 100x the demo corpus.

The demo corpus is one GRPO group of 8 Claude Code-shaped rollouts (148 calls, 1.57M flat
tokens: prompt + completion summed over calls), kx is k groups of one harness
(bench/tree_memory.py writes them once under the temp directory; 100x is 15,027 calls, 161M
flat tokens, 760 MB of JSONL). Each row runs the CLI in a fresh interpreter and reports its peak
RSS over that of an interpreter that only imported claw_tree, per flat token.

Goal (issue 30): at most about 20 bytes per flat token. Per-session and per-group packing are
held to it at 10x and 100x; `--pack batch` with `--max-tokens` too (without a budget one harness's
whole batch is one sample, as large as the corpus's tree). 1x is reported, not held: there a
fixed part (one group's sample, numpy's buffers) is a large share of a small corpus.

Run: .venvs/claw-tree/bin/python -m pytest bench/test_tree_memory.py --benchmark-only -s
(100x takes about 4 minutes: `-m slow` runs it, `-m "not slow"` leaves it out).
"""

from __future__ import annotations

import pytest
import tree_memory  # bench/ is on pytest's pythonpath (root pyproject.toml)

GOAL = 20.0  # bytes per flat token over the interpreter's baseline
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
