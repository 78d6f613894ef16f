"""Harbor / Terminal-Bench 2 tasks with continuous rewards and the Docker image of their Dockerfile.

Extends claw_bench.harbor (which reads instruction.md, task.toml, tests/, solution/ and the
Dockerfile; task scripts are never rewritten): the verify step becomes a bash runner (task
images need not have Python), placed with the job's own verify files at ``/logs/claw``, that

- runs ``bash /tests/test.sh`` from the WORKDIR with ``[verifier].env`` and kills it at
  ``[verifier] timeout_sec``,
- takes the reward from ``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (numeric
  keys: named sub-scores, reward = their mean), and counts a missing reward as 0,
- records why in ``/logs/claw/details.json`` (timeout, exit code, missing reward).

``[environment] cpus`` / ``memory_mb`` / ``storage_mb`` become the job's limits (``storage_mb`` as
``disk_mb``, which the sandbox enforces where its backend can). The image is the one
claw_bench.harbor chose: ``[environment] docker_image`` when set, else a tag derived from the
content of ``environment/`` (``claw-harbor/<task>:<sha12>``) that ``claw-bench images --build``
builds (the Docker backend never pulls or builds by itself).
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import TaskError
from claw_bench.harbor import (
    CLAW_LOGS,
    HARBOR_DETAILS,
    is_harbor_multistep,
    is_harbor_task,
    load_harbor_task,
    parse_artifacts,
    step_names,
)
from claw_bench.loaders._common import VERIFY_MARGIN_S, LoadOptions
from claw_bench.tasks import Script, Task, read_text_tree

_RUNNER = r"""#!/bin/bash
# claw-bench's Harbor verify runner: runs tests/test.sh, turns reward.txt / reward.json into the reward.
L=/logs/verifier; R="${CLAW_REWARD_FILE:-/logs/claw/reward.json}"
mkdir -p "$L"; rm -f "$L/reward.txt" "$L/reward.json"
__ENV__
timeout -s KILL __TIMEOUT__ bash /tests/test.sh; code=$?
reason=""
if [ "$code" = 137 ]; then reason="tests/test.sh killed at its timeout (__TIMEOUT__s)"; fi
if [ -z "$reason" ] && [ -s "$L/reward.txt" ]; then
  v=$(tr -d ' \t\r\n' < "$L/reward.txt")
  if printf '%s' "$v" | grep -Eqx '([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?' \
     && awk -v x="$v" 'BEGIN { exit !(x + 0 >= 0 && x + 0 <= 1) }'; then
    awk -v x="$v" 'BEGIN { printf "%.10g\n", x + 0 }' > "$R"
  else echo 0 > "$R"; reason="reward.txt is not a number in [0, 1]: $(printf '%s' "$v" | head -c 80)"; fi
elif [ -z "$reason" ] && [ -s "$L/reward.json" ]; then cp "$L/reward.json" "$R"
else echo 0 > "$R"; [ -n "$reason" ] || reason="no reward: tests/test.sh (exit $code) wrote neither reward.txt nor reward.json"
fi
timed_out=false; [ "$code" = 137 ] && timed_out=true
if [ -n "$reason" ]; then
  echo "reward 0 ($reason)"
  r="\"$(printf '%s' "$reason" | sed 's/\\/\\\\/g; s/"/\\"/g')\""
else r=null; fi
printf '{"checker_exit_code": %s, "checker_timed_out": %s, "reason": %s}\n' "$code" "$timed_out" "$r" > "__DETAILS__"
exit "$code"
"""


def _toml(task_dir: Path) -> dict[str, Any]:
    p = task_dir / "task.toml"
    if not p.is_file():
        return {}
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{p}: invalid TOML: {exc}") from exc


def runner_text(timeout: float, env: dict[str, Any]) -> str:
    """claw's Harbor verify runner for a verifier timeout and ``[verifier].env``."""
    exports = "\n".join(
        f"export {k}={shlex.quote(str(v))}" for k, v in env.items() if str(k).isidentifier()
    )
    return (
        _RUNNER.replace("__TIMEOUT__", f"{timeout:g}")
        .replace("__ENV__", exports)
        .replace("__DETAILS__", HARBOR_DETAILS)
    )


def _env_table(table: dict[str, Any], what: str, tpath: Path) -> dict[str, Any]:
    env = table.get("env", {})
    if not isinstance(env, dict):
        raise TaskError(f"{tpath}: field {what} env must be a table")
    return env


def load_harbor_tb_task(task_dir: str | Path, opts: LoadOptions | None = None) -> Task:
    """A Harbor / Terminal-Bench 2 task directory as a Task with the continuous-reward runner
    (a multi-step task's steps in ``meta["harbor_steps"]``, see :func:`_steps`)."""
    opts = opts or LoadOptions()
    task_dir = Path(task_dir)
    if not is_harbor_task(task_dir) and not is_harbor_multistep(task_dir):
        raise TaskError(f"{task_dir}: not a Harbor task (needs instruction.md and tests/)")
    base = load_harbor_task(task_dir)
    meta = _toml(task_dir)
    vtable = t if isinstance(t := meta.get("verifier"), dict) else {}
    env = _env_table(vtable, "[verifier]", task_dir / "task.toml")
    timeout = opts.checker_timeout_s or base.verify_timeout_s
    text = runner_text(timeout, env)
    hidden = {k: v for k, v in base.hidden.items()}
    hidden["tests/test.sh"] = base.verify.text
    task_meta = dict(base.meta)
    task_meta["collect"] = [HARBOR_DETAILS]
    etable = t if isinstance(t := meta.get("environment"), dict) else {}
    limits: dict[str, Any] = {}
    for key, name, kind in (
        ("cpus", "cpus", float),
        ("memory_mb", "memory_mb", int),
        ("storage_mb", "disk_mb", int),
    ):
        v = etable.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise TaskError(
                    f"{task_dir / 'task.toml'}: field [environment] {key} must be a positive number, got {v!r}"
                )
            limits[name] = kind(v)
    if limits:
        task_meta["limits"] = limits  # job limits (plan --cpus / --memory-mb override them)
    if is_harbor_multistep(task_dir):
        strategy = meta.get("multi_step_reward_strategy") or "mean"
        if strategy not in STRATEGIES:
            raise TaskError(
                f"{task_dir / 'task.toml'}: field multi_step_reward_strategy must be one of "
                f"{STRATEGIES}, got {strategy!r}"
            )
        task_meta["harbor_steps"] = _steps(task_dir, meta, base, opts, env)
        task_meta["multi_step_reward_strategy"] = strategy
        agent_s = sum(st["timeout_s"] for st in task_meta["harbor_steps"])
        base = attrs.evolve(base, timeout_s=agent_s)
    return attrs.evolve(
        base,
        verify=Script(name="harbor_verify.sh", text=text, interpreter="bash"),
        hidden=hidden,
        reward_file=f"{CLAW_LOGS}/reward.json",
        verify_timeout_s=timeout + VERIFY_MARGIN_S,
        pass_threshold=opts.pass_threshold,
        meta=task_meta,
    )


#: Harbor's rules for a multi-step trial's reward (claw_bench.score applies them)
STRATEGIES = ("mean", "final")


def _positive(table: dict[str, Any], key: str, default: float, where: str) -> float:
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise TaskError(f"{where}: field {key} must be a positive number, got {v!r}")
    return float(v)


def _steps(
    task_dir: Path, meta: dict[str, Any], base: Task, opts: LoadOptions, env: dict[str, Any]
) -> list[dict[str, Any]]:
    """One dict per ``[[steps]]`` entry, in order, as Harbor runs them: the step's instruction;
    its tests (the task's tests/ with the step's own on top, so a step's test.sh wins); the verify
    runner with the step's ``[steps.verifier]`` timeout and env (else the task's); the agent
    timeout; ``workdir/`` files (copied into the WORKDIR before the agent; its ``setup.sh`` runs
    then); the solution folder (oracle); ``min_reward``; ``healthcheck``; ``artifacts``."""
    tpath = task_dir / "task.toml"
    task_tests = {k[len("tests/") :]: v for k, v in base.hidden.items() if k.startswith("tests/")}
    if base.verify.text:
        task_tests["test.sh"] = base.verify.text
    out = []
    for i, (name, st) in enumerate(zip(step_names(meta, tpath), meta["steps"], strict=True)):
        where = f"{tpath}: steps[{i}] ({name})"
        sdir = task_dir / "steps" / name
        ipath = sdir / "instruction.md"
        if not ipath.is_file() or not ipath.read_text(encoding="utf-8").strip():
            raise TaskError(f"{where}: missing or empty {ipath.relative_to(task_dir)}")
        tests = {**task_tests, **read_text_tree(sdir / "tests", what=f"task {base.id}")}
        if not isinstance(tests.get("test.sh"), str) or not tests["test.sh"]:
            raise TaskError(f"{where}: no tests/test.sh (neither the step's nor the task's)")
        agent = t if isinstance(t := st.get("agent"), dict) else {}
        verifier = t if isinstance(t := st.get("verifier"), dict) else {}
        v_timeout = opts.checker_timeout_s or _positive(
            verifier, "timeout_sec", base.verify_timeout_s, f"{where} verifier"
        )
        step_env = _env_table(verifier, f"steps[{i}].verifier", tpath) if "env" in verifier else env
        solution = read_text_tree(sdir / "solution", what=f"task {base.id}")
        if solution and not isinstance(solution.get("solve.sh"), str):
            raise TaskError(f"{where}: solution/ has no solve.sh (UTF-8 text)")
        min_reward = st.get("min_reward")
        ok = isinstance(min_reward, int | float) or (
            isinstance(min_reward, dict)
            and all(isinstance(v, int | float) for v in min_reward.values())
        )
        if min_reward is not None and (isinstance(min_reward, bool) or not ok):
            raise TaskError(f"{where}: min_reward must be a number or a table of numbers")
        hc = st.get("healthcheck")
        if hc is not None and not (isinstance(hc, dict) and isinstance(hc.get("command"), str)):
            raise TaskError(f"{where}: healthcheck must be a table with a command")
        out.append(
            {
                "name": name,
                "instruction": ipath.read_text(encoding="utf-8").strip() + "\n",
                "timeout_s": _positive(agent, "timeout_sec", base.timeout_s, f"{where} agent"),
                "tests": tests,
                "runner": runner_text(v_timeout, step_env),
                "verify_timeout_s": v_timeout + VERIFY_MARGIN_S,
                "workdir_files": read_text_tree(sdir / "workdir", what=f"task {base.id}"),
                "solution": solution,
                "min_reward": min_reward,
                "healthcheck": hc,
                "artifacts": parse_artifacts(st.get("artifacts"), f"{where}: field artifacts"),
            }
        )
    return out
