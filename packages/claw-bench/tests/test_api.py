"""The public API: __all__ is complete and importable; importing claw_bench stays light."""

from __future__ import annotations

import subprocess
import sys

import claw_bench


def test_all_names_exist_and_public_modules_are_covered():
    """Every name in __all__ exists; every public function of the main modules is re-exported."""
    for name in claw_bench.__all__:
        assert hasattr(claw_bench, name), name
    for name in (
        "load_suite",
        "plan_jobs",
        "score_runs",
        "pass_at_k",
        "report",
        "load_harness",
        "mint_token",
    ):
        assert name in claw_bench.__all__
    public = {n for n in dir(claw_bench) if not n.startswith("_") and n[0].isalpha()}
    modules = {
        "agent",
        "check",
        "cli",
        "errors",
        "families",
        "harbor",
        "harnesses",
        "images",
        "loaders",
        "passk",
        "plan",
        "records",
        "report",
        "reward",
        "score",
        "suites",
        "tasks",
        "token",
    }
    assert public - modules - {"annotations"} <= set(claw_bench.__all__)


def test_import_pulls_no_heavy_dependency():
    """`import claw_bench` loads neither torch nor matplotlib (plots import it lazily)."""
    code = "import sys, claw_bench, claw_bench.cli; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
