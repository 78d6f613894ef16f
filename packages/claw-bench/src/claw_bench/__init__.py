"""claw-bench: tasks, harness adapters as data, job planning, scoring and Pass@k reports."""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

if _typing.TYPE_CHECKING:
    from claw_bench.check import check_task
    from claw_bench.errors import (
        ClawError,
        DockerError,
        HarnessError,
        PlanError,
        RecordError,
        TaskError,
    )
    from claw_bench.families import expert_script, load_family
    from claw_bench.harbor import load_harbor_task
    from claw_bench.harnesses import Harness, list_harnesses, load_harness
    from claw_bench.images import ImageRow, build_images, list_images
    from claw_bench.loaders import Judge, JudgeError, LoadOptions, detect_layout, load_public
    from claw_bench.passk import pass_at_k, pass_at_k_brute
    from claw_bench.plan import plan_jobs
    from claw_bench.records import read_records, write_records
    from claw_bench.report import compare, plot_report, render_text, report
    from claw_bench.reward import parse_reward
    from claw_bench.rollouts import Rollouts, Runner, outcome_summary, rollouts, sandbox_cli
    from claw_bench.score import score_run, score_runs
    from claw_bench.suites import Suite, builtin_suites, load_suite
    from claw_bench.tasks import Task, load_task
    from claw_bench.token import mint_token, verify_token

# Each name is imported from its module on first use (PEP 562): every rollout of a claw-agent
# harness starts `python -m claw_bench.agent`, which imports this package first, and importing
# all of it (numpy, httpx, importlib.metadata, ...) took ~0.3 CPU-s per rollout, more than the
# toy-steps rollout's three model calls.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "claw_bench.check": ("check_task",),
    "claw_bench.errors": (
        "ClawError",
        "DockerError",
        "HarnessError",
        "PlanError",
        "RecordError",
        "TaskError",
    ),
    "claw_bench.families": ("expert_script", "load_family"),
    "claw_bench.harbor": ("load_harbor_task",),
    "claw_bench.harnesses": ("Harness", "list_harnesses", "load_harness"),
    "claw_bench.images": ("ImageRow", "build_images", "list_images"),
    "claw_bench.loaders": ("Judge", "JudgeError", "LoadOptions", "detect_layout", "load_public"),
    "claw_bench.passk": ("pass_at_k", "pass_at_k_brute"),
    "claw_bench.plan": ("plan_jobs",),
    "claw_bench.records": ("read_records", "write_records"),
    "claw_bench.report": ("compare", "plot_report", "render_text", "report"),
    "claw_bench.reward": ("parse_reward",),
    "claw_bench.rollouts": ("Rollouts", "Runner", "outcome_summary", "rollouts", "sandbox_cli"),
    "claw_bench.score": ("score_run", "score_runs"),
    "claw_bench.suites": ("Suite", "builtin_suites", "load_suite"),
    "claw_bench.tasks": ("Task", "load_task"),
    "claw_bench.token": ("mint_token", "verify_token"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "ClawError",
    "DockerError",
    "Harness",
    "HarnessError",
    "ImageRow",
    "Judge",
    "JudgeError",
    "LoadOptions",
    "PlanError",
    "RecordError",
    "Rollouts",
    "Runner",
    "Suite",
    "Task",
    "TaskError",
    "__version__",
    "build_images",
    "builtin_suites",
    "check_task",
    "compare",
    "detect_layout",
    "expert_script",
    "list_harnesses",
    "list_images",
    "load_family",
    "load_harbor_task",
    "load_public",
    "load_harness",
    "load_suite",
    "load_task",
    "mint_token",
    "outcome_summary",
    "parse_reward",
    "pass_at_k",
    "pass_at_k_brute",
    "plan_jobs",
    "plot_report",
    "read_records",
    "render_text",
    "report",
    "rollouts",
    "sandbox_cli",
    "score_run",
    "score_runs",
    "verify_token",
    "write_records",
]


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        from importlib.metadata import version

        value: _typing.Any = version("claw-bench")
    elif name in _WHERE:
        value = getattr(_importlib.import_module(_WHERE[name]), name)
    else:  # a submodule (claw_bench.families, ...) not imported yet
        try:
            value = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


class _Package(_types.ModuleType):
    """`claw_bench.report` is a function of the module of the same name: the import system's
    binding of the submodule (when the CLI imports it) must not replace the function."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if not (isinstance(value, _types.ModuleType) and name in _WHERE):
            super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
