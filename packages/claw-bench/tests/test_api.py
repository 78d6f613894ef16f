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
    modules = {  # every public module of the package (a test may have imported any of them)
        "agent",
        "check",
        "cli",
        "datasets",
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
        "rollouts",
        "score",
        "suites",
        "tasks",
        "token",
        "trials",
    }
    assert public - modules - {"annotations"} <= set(claw_bench.__all__)


def test_import_pulls_no_heavy_dependency():
    """`import claw_bench` loads neither torch nor matplotlib (plots import it lazily)."""
    code = "import sys, claw_bench, claw_bench.cli; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_import_is_lazy_and_exports_are_the_modules_objects():
    """`import claw_bench.agent` (once per rollout) loads no other claw_bench module nor numpy; an
    exported name is its module's object, a submodule is reachable, a typo is an AttributeError."""
    code = (
        "import sys, claw_bench.agent; "
        "print(sorted(m for m in sys.modules if m.startswith(('claw_bench.', 'numpy')) "
        "and m != 'claw_bench.agent'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
    from claw_bench.families import expert_script
    from claw_bench.report import compare
    from claw_bench.suites import load_suite

    assert callable(claw_bench.report)  # the function, not its module of the same name
    assert claw_bench.compare is compare

    assert claw_bench.load_suite is load_suite
    assert claw_bench.families.expert_script is expert_script
    assert claw_bench.__version__
    try:
        claw_bench.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("claw_bench.no_such_name did not raise AttributeError")
