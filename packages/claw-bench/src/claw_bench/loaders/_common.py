"""Shared pieces of the public-suite loaders: the verifier runner, its config, task options."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import attrs

from claw_bench.tasks import VERIFY_DIR, Script

RUNNER_NAME = "runner.py"
DETAILS_FILE = f"{VERIFY_DIR}/details.json"
#: the agent's files, snapshotted by the runner for the LLM judge (collected with the run)
JUDGE_FILES = f"{VERIFY_DIR}/judge_files.json"
DEFAULT_CHECKER_TIMEOUT_S = 120.0
#: seconds the sandbox's verify step gets beyond the checker's own timeout (copying, reporting)
VERIFY_MARGIN_S = 30.0


@attrs.frozen(kw_only=True)
class LoadOptions:
    """How public tasks are turned into claw tasks.

    - ``pass_threshold``: ``passed = reward >= pass_threshold`` (ClawGym's RL logs use 0.5; a task
      counts as solved at 1.0, the default).
    - ``workspace_dir``: where the sandbox mounts the workspace, when the checkers should see a
      fixed path (e.g. ``/root/.openclaw/workspace`` in a Docker image that mounts it there).
      None (default): the workspace is the verifier's working directory, found at verify time,
      and every occurrence of the task's mount dir in the checker is rewritten to it.
    - ``checker_timeout_s``: the checker is killed after this long and scores 0 (ClawGym: 120 s);
      None keeps the task's own value.
    - ``assets_dir``: PinchBench ``workspace_files[].source`` root (default: the ``assets/`` next
      to the tasks directory, then the task file's directory).
    """

    pass_threshold: float = attrs.field(
        default=1.0,
        validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0)),
    )
    workspace_dir: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.matches_re(r"/.*"))
    )
    checker_timeout_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0))
    )
    assets_dir: str | None = None


@functools.cache
def runner_script() -> Script:
    """The stdlib-only verifier runner (``_runner.py``) as a task Script (read once)."""
    text = (Path(__file__).parent / "_runner.py").read_text(encoding="utf-8")
    return Script(name=RUNNER_NAME, text=text, interpreter="python3")


def runner_config(**cfg: Any) -> str:
    """The runner's ``runner.json`` text."""
    return json.dumps(cfg, indent=1, sort_keys=True)


def judge_spec(
    *,
    rubric: str,
    instruction: str,
    automated: float,
    llm_judge: float,
    grading: str,
    criteria: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``judge`` entry of a task's meta (carried in job and run meta to ``claw-bench score``);
    with ``criteria`` the rubric is judged criterion by criterion (claw_bench.loaders.rubric)."""
    spec: dict[str, Any] = {
        "rubric": rubric,
        "instruction": instruction,
        "grading": grading,
        "weights": {"automated": float(automated), "llm_judge": float(llm_judge)},
    }
    if criteria is not None:
        spec["criteria"] = criteria
    return spec


def checker_details(run: dict[str, Any]) -> dict[str, Any]:
    """What a public-task runner recorded in ``details.json`` (collected with the run), flattened.

    Named sub-scores keep their names; the rest (reason, checker exit code, timed out, automated
    score, transcript) keep theirs. Empty when the run carries no such file or it is unreadable.
    """
    collected = run.get("collected") or {}
    text = collected.get(
        DETAILS_FILE, collected.get("/logs/claw/details.json")
    )  # claw / Harbor jobs
    if not isinstance(text, str):
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {"checker_details_error": f"{DETAILS_FILE} is not JSON: {text[:120]!r}"}
    if not isinstance(data, dict):
        return {}
    out = {k: v for k, v in data.items() if k not in ("scores", "checker_output") and v is not None}
    scores = data.get("scores")
    if isinstance(scores, dict):
        out.update(
            {
                k: float(v)
                for k, v in scores.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        )
    if isinstance(data.get("checker_output"), str) and data.get("reason"):
        out["checker_output"] = data["checker_output"][-2000:]
    return out
