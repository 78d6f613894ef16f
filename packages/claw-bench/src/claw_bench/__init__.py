"""claw-bench: tasks, harness adapters as data, job planning, scoring and Pass@k reports."""

from importlib.metadata import version as _version

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
from claw_bench.score import score_run, score_runs
from claw_bench.suites import Suite, builtin_suites, load_suite
from claw_bench.tasks import Task, load_task
from claw_bench.token import mint_token, verify_token

__version__ = _version("claw-bench")
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
    "parse_reward",
    "pass_at_k",
    "pass_at_k_brute",
    "plan_jobs",
    "plot_report",
    "read_records",
    "render_text",
    "report",
    "score_run",
    "score_runs",
    "verify_token",
    "write_records",
]
