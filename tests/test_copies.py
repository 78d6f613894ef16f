"""Code that packages may not share by import is copied, and the copies must not drift."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_output_path_helper_copies_match():
    """claw-tree's `_cli_paths.py` is copied byte for byte into claw-bench and begins claw-rl's copy."""
    ref = (ROOT / "packages/claw-tree/src/claw_tree/_cli_paths.py").read_bytes()
    assert (ROOT / "packages/claw-bench/src/claw_bench/_cli_paths.py").read_bytes() == ref
    assert (
        (ROOT / "packages/claw-rl/src/claw_rl/_cli_paths.py")
        .read_bytes()
        .startswith(ref.rstrip(b"\n"))
    )
