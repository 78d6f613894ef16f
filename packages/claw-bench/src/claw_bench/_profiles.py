"""Execution profiles: how a planned job runs a task. Chosen once per task (:func:`profile_for`):
claw's own (the workspace is the job's cwd, the verifier's files land at verify time) or
Harbor's (``profile: "harbor"``: the task's WORKDIR, /logs, /tests and /solution mounts)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from claw_bench._job import JobSpec
from claw_bench.harbor import (
    CLAW_LOGS,
    LOGS_AGENT,
    LOGS_ARTIFACTS,
    LOGS_VERIFIER,
    SOLUTION,
    TESTS,
)
from claw_bench.harnesses import INSTRUCTION_FILE, Harness
from claw_bench.tasks import Task, job_files

#: a model harness's command on another instruction; ``cont``: continue the session before it
Render = Callable[..., str]


class Profile(Protocol):
    """Turns the plain job of a (task, harness, sample) into the job this profile runs."""

    def job(self, spec: JobSpec, task: Task, h: Harness, render: Render | None) -> JobSpec: ...


def profile_for(task: Task) -> Profile:
    """The profile of a task: Harbor's for a Harbor task (``meta["harbor"]``), else claw's."""
    hb = task.meta.get("harbor")
    return HarborProfile(hb) if isinstance(hb, dict) else ClawProfile()


@attrs.frozen
class ClawProfile:
    """claw's own: the job as planned; a multi-session task (PinchBench ``sessions[]``) run by
    a model harness becomes one step per prompt (:func:`_sessions`)."""

    def job(self, spec: JobSpec, task: Task, h: Harness, render: Render | None) -> JobSpec:
        if task.meta.get("sessions") and render is not None:
            return _sessions(spec, task, h, render)
        return spec


def _sessions(spec: JobSpec, task: Task, h: Harness, render: Render) -> JobSpec:
    """A multi-session task (PinchBench ``sessions[]``): one step per prompt, in order, in the one
    workspace, graded once at the end (the job's verify). A prompt that continues the session
    before it runs the harness's ``continue_command`` when the adapter has one; without one it
    runs as a new harness session, and ``meta.sessions_not_continued`` names it."""
    steps, not_continued = [], []
    for i, sess in enumerate(task.meta["sessions"]):
        cont = i > 0 and not sess["new_session"]
        if cont and not h.continue_command:
            not_continued.append(sess["id"])
        steps.append(
            {
                "name": sess["id"],
                "command": render(sess["prompt"], cont=cont and bool(h.continue_command)),
                "timeout_s": task.timeout_s,
                "files": {INSTRUCTION_FILE: sess["prompt"]},
            }
        )
    meta = {**spec.meta, "sessions_not_continued": not_continued} if not_continued else spec.meta
    return attrs.evolve(spec, steps=steps, command=steps[0]["command"], meta=meta)


@attrs.frozen
class HarborProfile:
    """Harbor's execution model (claw.job/v1 ``profile: "harbor"``) for a task's ``meta["harbor"]``
    (``hb``): the WORKDIR as workspace and cwd, writable /logs/agent, /logs/verifier and
    /logs/artifacts, the tests at /tests at verify time only, the solution folder at /solution
    for the oracle; scripts run unchanged. A multi-step task gets ``steps``
    (:func:`_harbor_steps`)."""

    hb: dict[str, Any]

    def job(self, spec: JobSpec, task: Task, h: Harness, render: Render | None) -> JobSpec:
        hb = self.hb
        spec = self._run(spec, task, h, render)
        verify = spec.verify
        if verify is not None:
            verify = _harbor_verify(task, hb.get("artifacts", []))
        spec = attrs.evolve(
            spec,
            profile="harbor",
            workdir=hb["workdir"],
            image_run=list(hb["image_run"]) if hb.get("image_run") else None,
            image_env=dict(hb["image_env"]) if hb.get("image_env") else None,
            verify=verify,
        )
        return attrs.evolve(spec, collect=_collect(spec, hb["workdir"]))

    def _run(self, spec: JobSpec, task: Task, h: Harness, render: Render | None) -> JobSpec:
        """The agent's part: its mounts, and what the oracle runs (the solution at /solution)."""
        oracle = h.builtin == "oracle"
        scorable = "not_scorable" not in spec.meta
        mounts: list[dict[str, Any]] = [
            {"target": LOGS_AGENT},
            {"target": LOGS_VERIFIER},
            {"target": LOGS_ARTIFACTS},
        ]
        # the oracle's workspace is the task's alone; its solution is mounted, not copied in
        workspace = job_files(task.workspace)
        env = {k: v for k, v in spec.env.items() if k != "CLAW_SOLUTION_DIR"}
        if task.meta.get("harbor_steps") and scorable:
            if oracle:
                mounts.append({"target": SOLUTION})
                spec = attrs.evolve(spec, workspace=workspace, env=env)
            steps = _harbor_steps(spec.command, task, h, render)
            meta = {
                **spec.meta,
                "multi_step_reward_strategy": task.meta["multi_step_reward_strategy"],
            }
            # command: what a reader that does not know `steps` would run
            return attrs.evolve(
                spec,
                mounts=mounts,
                steps=steps,
                command=steps[0]["command"],
                verify=None,
                meta=meta,
            )
        if oracle and task.solution is not None and scorable:
            sol = task.solution_files or {task.solution.name: task.solution.text}
            mounts.append({"target": SOLUTION, "files": job_files(sol)})
            command = task.solution.command(f"{SOLUTION}/{task.solution.name}")
            spec = attrs.evolve(spec, command=command, workspace=workspace, env=env)
        return attrs.evolve(spec, mounts=mounts)


def _harbor_verify(task: Task, artifacts: list[dict[str, Any]]) -> dict[str, Any]:
    """A single-step Harbor task's verify step: its tests/ at /tests (test.sh as the verifier
    when it is the task's), the reward at /logs/verifier, then the artifact copies."""
    tests = {k[len("tests/") :]: v for k, v in task.hidden.items() if k.startswith("tests/")}
    plain = task.verify.name == "tests/test.sh"
    if plain:
        tests["test.sh"] = task.verify.text
    command, vmounts = _verify_mounts(task, tests, None if plain else task.verify.text)
    return {
        "command": _with_artifacts(command, artifacts, LOGS_ARTIFACTS),
        "timeout_s": task.verify_timeout_s,
        "mounts": vmounts,
        "reward_file": task.reward_file,
        "reset": [LOGS_VERIFIER],  # the verifier's: what the agent left there goes first
    }


def _collect(spec: JobSpec, workdir: str) -> list[str]:
    """The job's collect patterns that lie in a place the job has (its WORKDIR, a mount, a verify
    or step mount), then Harbor's /logs folders."""
    steps = spec.steps or []
    vms = [m for v in [spec.verify or {}, *steps] for m in v.get("mounts", [])]
    vms += [m for st in steps for m in st.get("verify", {}).get("mounts", [])]
    places = [workdir, *(m["target"] for m in [*(spec.mounts or []), *vms])]
    kept = [
        c
        for c in spec.collect
        if not c.startswith("/") or any(c.startswith(p + "/") for p in places)
    ]
    return [*kept, f"{LOGS_VERIFIER}/**", f"{LOGS_AGENT}/**", f"{LOGS_ARTIFACTS}/**"]


def artifact_copy(artifacts: list[dict[str, Any]], root: str) -> str:
    """Shell (POSIX sh) that copies each of task.toml's ``artifacts`` (file or folder, if it
    exists) to ``root/<destination>``, as Harbor gathers a trial's artifacts after verification."""
    parts = []
    for a in artifacts:
        src, dest = shlex.quote(a["source"]), shlex.quote(f"{root}/{a['destination']}")
        excl = "".join(f" --exclude={shlex.quote(x)}" for x in a.get("exclude", []))
        copy_dir = (
            f"tar -C {src} -cf -{excl} . | tar -C {dest} -xf -"
            if excl
            else f"cp -a {src}/. {dest}/"
        )
        parts.append(
            f"if [ -d {src} ]; then mkdir -p {dest} && {copy_dir}; "
            f'elif [ -e {src} ]; then mkdir -p "$(dirname {dest})" && cp -a {src} {dest}; fi'
        )
    return "; ".join(parts)


def _with_artifacts(command: str, artifacts: list[dict[str, Any]], root: str) -> str:
    """The verify command, then the artifact copies; the verifier's exit code is kept."""
    if not artifacts:
        return command
    return f"{command}; code=$?; {artifact_copy(artifacts, root)}; exit $code"


def _verify_mounts(task: Task, tests: dict[str, Any], runner: str | None) -> tuple[str, list]:
    """(command, verify mounts) of a Harbor verify step: the tests at /tests, and claw's verify
    runner at /logs/claw unless the task's own test.sh writes the reward (``runner`` None)."""
    vmounts: list[dict[str, Any]] = [{"target": TESTS, "files": job_files(tests)}]
    if runner is None:  # plain Harbor: test.sh writes the reward itself
        command = (
            f"rm -f {LOGS_VERIFIER}/reward.txt {LOGS_VERIFIER}/reward.json; bash {TESTS}/test.sh"
        )
    else:  # claw's verify runner (reward.txt / reward.json -> the reward file, details)
        vmounts.append({"target": CLAW_LOGS, "files": {task.verify.name: runner}})
        command = f"CLAW_REWARD_FILE={task.reward_file} bash {CLAW_LOGS}/{task.verify.name}"
    return command, vmounts


def _healthcheck(hc: dict[str, Any]) -> str:
    """A step's healthcheck as a setup command: its command retried like Docker's HEALTHCHECK."""
    retries = int(hc.get("retries", 3)) if isinstance(hc.get("retries"), int) else 3
    interval = hc.get("interval_sec", 1)
    interval = interval if isinstance(interval, int | float) and interval >= 0 else 1
    cmd = shlex.quote(hc["command"])
    return (
        f"i=0; while [ $i -lt {max(1, retries)} ]; do sh -c {cmd} && exit 0; i=$((i+1)); "
        f"sleep {interval:g}; done; echo 'healthcheck failed: '{cmd} >&2; exit 1"
    )


def _harbor_steps(
    command: str, task: Task, h: Harness, render: Render | None
) -> list[dict[str, Any]]:
    """A Harbor multi-step task's ``steps``: run in order in the one trial environment, each with
    its WORKDIR uploads (and their setup.sh), healthcheck, agent run on the step's instruction
    (``render``; the oracle runs the step's solve.sh at /solution; another harness its
    ``command``), and verify with the task's tests/ under the step's at /tests and the step's
    ``min_reward``."""
    artifacts = task.meta["harbor"].get("artifacts", [])
    return [
        _harbor_step(st, command, task, h, render, artifacts) for st in task.meta["harbor_steps"]
    ]


def _harbor_step(
    st: dict[str, Any],
    command: str,
    task: Task,
    h: Harness,
    render: Render | None,
    artifacts: list[dict[str, Any]],
) -> dict[str, Any]:
    """One step of :func:`_harbor_steps`."""
    files = dict(st["workdir_files"])
    setup = ["bash ./setup.sh"] if "setup.sh" in files else []
    if st.get("healthcheck"):
        setup.append(_healthcheck(st["healthcheck"]))
    step: dict[str, Any] = {"name": st["name"], "timeout_s": st["timeout_s"]}
    if h.builtin == "oracle":
        step["command"] = "bash /solution/solve.sh" if st["solution"] else "true"
        step["mounts"] = [{"target": SOLUTION, "files": job_files(st["solution"])}]
    elif render is not None:
        step["command"] = render(st["instruction"])
        files[INSTRUCTION_FILE] = st["instruction"]
    else:
        step["command"] = command
    verify_command, vmounts = _verify_mounts(task, st["tests"], st["runner"])
    root = f"{LOGS_ARTIFACTS}/steps/{st['name']}"
    step["verify"] = {
        "command": _with_artifacts(verify_command, [*artifacts, *st["artifacts"]], root),
        "timeout_s": st["verify_timeout_s"],
        "mounts": vmounts,
        "reward_file": task.reward_file,
        "reset": [LOGS_VERIFIER],  # the verifier's: what the agent left there goes first
    }
    if files:
        step["files"] = job_files(files)
    if setup:
        step["setup"] = setup
    if st.get("min_reward") is not None:
        step["min_reward"] = st["min_reward"]
    return step
