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
from claw_bench.harbor import CLAW_LOGS, HARBOR_DETAILS, is_harbor_task, load_harbor_task
from claw_bench.loaders._common import VERIFY_MARGIN_S, LoadOptions
from claw_bench.tasks import Script, Task

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


def load_harbor_tb_task(task_dir: str | Path, opts: LoadOptions | None = None) -> Task:
    """A Harbor / Terminal-Bench 2 task directory as a Task with the continuous-reward runner."""
    opts = opts or LoadOptions()
    task_dir = Path(task_dir)
    if not is_harbor_task(task_dir):
        raise TaskError(f"{task_dir}: not a Harbor task (needs instruction.md and tests/)")
    base = load_harbor_task(task_dir)
    meta = _toml(task_dir)
    vtable = t if isinstance(t := meta.get("verifier"), dict) else {}
    env = vtable.get("env", {})
    if not isinstance(env, dict):
        raise TaskError(f"{task_dir / 'task.toml'}: field [verifier] env must be a table")
    timeout = opts.checker_timeout_s or base.verify_timeout_s
    exports = "\n".join(
        f"export {k}={shlex.quote(str(v))}" for k, v in env.items() if str(k).isidentifier()
    )
    text = (
        _RUNNER.replace("__TIMEOUT__", f"{timeout:g}")
        .replace("__ENV__", exports)
        .replace("__DETAILS__", HARBOR_DETAILS)
    )
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
    return attrs.evolve(
        base,
        verify=Script(name="harbor_verify.sh", text=text, interpreter="bash"),
        hidden=hidden,
        reward_file=f"{CLAW_LOGS}/reward.json",
        verify_timeout_s=timeout + VERIFY_MARGIN_S,
        pass_threshold=opts.pass_threshold,
        meta=task_meta,
    )
