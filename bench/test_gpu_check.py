"""bench/gpu_check.py's logic on CPU with a tiny model (--tiny): what the GPU run will write.

Run: .venvs/claw-rl/bin/python -m pytest bench/test_gpu_check.py -s (about 20 s)
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def test_gpu_check_tiny_dry_run(tmp_path):
    """The tiny run measures tree, chain merge and per call at two sizes and writes one JSON
    file with their tokens, times and the tree's token ratios and speedups."""
    out = tmp_path / "gpu_check.json"
    gpu_check.main(["--tiny", "--out", str(out), "--sizes", "2048", "4096", "--cap", "8000"])
    report = json.loads(out.read_text())
    assert set(report["sizes"]) == {"2048", "4096"}
    for n, row in report["sizes"].items():
        assert row["tree"]["tokens"] == int(n)
        for other in ("chain_merge", "per_call"):
            assert row[other]["tokens"] >= row["tree"]["tokens"] * 0.9  # paths repeat prefixes
            assert row[f"{other}_token_ratio"] == row[other]["tokens"] / int(n)
            assert row[other]["seconds"] > 0 and row[f"{other}_speedup"] > 0
    assert report["sizes"]["4096"]["per_call"]["subset"]  # 10K per-call tokens > --cap 8000
