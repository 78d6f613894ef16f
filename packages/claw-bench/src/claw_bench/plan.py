"""Planning: one claw.job/v1 per (task, harness, sample), pointed at the proxy with a session token."""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from claw_bench._choices import GROUP_BY, NETWORKS
from claw_bench.errors import PlanError
from claw_bench.harbor import (
    CLAW_LOGS,
    LOGS_AGENT,
    LOGS_ARTIFACTS,
    LOGS_VERIFIER,
    SOLUTION,
    TESTS,
)
from claw_bench.harnesses import INSTRUCTION_FILE, Harness
from claw_bench.records import JOB
from claw_bench.tasks import VERIFY_DIR, FileContent, Task, job_files
from claw_bench.token import mint_token

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: where the oracle's job holds the task's solution files (workspace-relative; removed before verify)
SOLUTION_DIR = ".claw_solution"
#: first words of the line a job prints when its harness cannot start (exit 127)
NOT_STARTED = "claw-bench"


def proxy_port(proxy_url: str) -> int:
    """The port of the proxy URL (explicit, or 80/443 from the scheme); PlanError when malformed."""
    parts = urlsplit(proxy_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PlanError(
            f"--proxy {proxy_url!r}: expected an http(s) URL such as http://127.0.0.1:8000"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise PlanError(f"--proxy {proxy_url!r}: bad port") from exc
    return port or (443 if parts.scheme == "https" else 80)


def session_id(run_id: str, task: str, harness: str, sample: int) -> str:
    """A readable session id, ``<run>-<task>-<harness>-<sample>``, kept within 128 safe chars."""
    raw = _UNSAFE.sub("_", f"{run_id}-{task}-{harness}-{sample}")
    if len(raw) <= 128:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{raw[:111]}-{digest}"


def _network(h: Harness, task: Task, network: str | None) -> str:
    """The network one job gets: ``network`` (default: proxy for model harnesses, none for the
    built-ins); a harness without a model never needs the proxy; a task's allow_internet = false
    always wins over host."""
    net = network or ("proxy" if h.needs_model else "none")
    if net == "none" and h.needs_model:
        raise PlanError(
            f"harness {h.name} talks to a model: --network none leaves it no way to reach one; "
            "use --network proxy (or host)"
        )
    if net == "proxy" and not h.needs_model:
        net = "none"
    if net == "host" and task.meta.get("allow_internet") is False:
        net = "proxy" if h.needs_model else "none"
    return net


def _preflight(h: Harness) -> str:
    """Shell that exits 127 with the reason when a required executable is missing in the job."""
    return "".join(
        f"command -v {shlex.quote(r)} >/dev/null 2>&1 || {{ echo {shlex.quote(f'{NOT_STARTED}: harness {h.name} could not start: {r} is not installed in the job environment')} >&2; exit 127; }}; "
        for r in h.requires
    )


def _renderer(h: Harness, values: dict[str, str], pre: str) -> Callable[..., str]:
    """The harness's command on another instruction (a step's, a session's prompt); ``cont``:
    the adapter's ``continue_command``, which continues the session before it."""

    def render(text: str, cont: bool = False) -> str:
        return pre + h.render({**values, "instruction": text}, cont=cont)[0]

    return render


def _oracle(task: Task) -> tuple[str | None, dict[str, FileContent], dict[str, str]]:
    """(command or None when the task has no solution, files, env) of the oracle's job."""
    if task.meta.get("harbor_steps"):  # each step's solve.sh runs at /solution (_harbor_steps)
        has = any(st["solution"] for st in task.meta["harbor_steps"])
        return ("true", {}, {}) if has else (None, {}, {})
    if task.solution is None:
        return None, {}, {}
    sol = task.solution_files or {task.solution.name: task.solution.text}
    files = {f"{SOLUTION_DIR}/{k}": v for k, v in sol.items()}
    run = task.solution.command(f"{SOLUTION_DIR}/{task.solution.name}")
    env = {**task.meta.get("solution_env", {}), "CLAW_SOLUTION_DIR": SOLUTION_DIR}
    return f"{run}; code=$?; rm -rf {SOLUTION_DIR}; exit $code", files, env


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
    job: dict[str, Any], task: Task, h: Harness, render: Callable[[str], str] | None
) -> None:
    """A Harbor multi-step task's job: its ``steps`` run in order in the one trial environment,
    each with its WORKDIR uploads (and their setup.sh), healthcheck, agent run on the step's
    instruction (``render``; the oracle runs the step's solve.sh at /solution), and verify with
    the task's tests/ under the step's at /tests and the step's ``min_reward``."""
    steps = []
    artifacts = task.meta["harbor"].get("artifacts", [])
    for st in task.meta["harbor_steps"]:
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
            step["command"] = job["command"]
        command, vmounts = _verify_mounts(task, st["tests"], st["runner"])
        root = f"{LOGS_ARTIFACTS}/steps/{st['name']}"
        step["verify"] = {
            "command": _with_artifacts(command, [*artifacts, *st["artifacts"]], root),
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
        steps.append(step)
    job["steps"] = steps
    job["command"] = steps[0]["command"]  # what a reader that does not know `steps` would run
    job.pop("verify", None)
    job["meta"]["multi_step_reward_strategy"] = task.meta["multi_step_reward_strategy"]


def _harbor(
    job: dict[str, Any],
    task: Task,
    hb: dict[str, Any],
    h: Harness,
    render: Callable[[str], str] | None,
) -> None:
    """Give a Harbor task's job Harbor's execution model (claw.job/v1 ``profile: "harbor"``): the
    WORKDIR as workspace and cwd, writable /logs/agent, /logs/verifier and /logs/artifacts, the
    tests at /tests at verify time only, the solution folder at /solution for the oracle; scripts
    run unchanged. A multi-step task gets ``steps`` (:func:`_harbor_steps`)."""
    oracle = h.builtin == "oracle"
    job["profile"], job["workdir"] = "harbor", hb["workdir"]
    mounts: list[dict[str, Any]] = [
        {"target": LOGS_AGENT},
        {"target": LOGS_VERIFIER},
        {"target": LOGS_ARTIFACTS},
    ]
    if task.meta.get("harbor_steps") and "not_scorable" not in job["meta"]:
        if oracle:
            mounts.append({"target": SOLUTION})
            job["workspace"] = {"files": job_files(task.workspace)}
            job["env"].pop("CLAW_SOLUTION_DIR", None)
        job["mounts"] = mounts
        _harbor_steps(job, task, h, render)
    elif oracle and task.solution is not None and "not_scorable" not in job["meta"]:
        sol = task.solution_files or {task.solution.name: task.solution.text}
        mounts.append({"target": SOLUTION, "files": job_files(sol)})
        job["command"] = task.solution.command(f"{SOLUTION}/{task.solution.name}")
        job["workspace"] = {"files": job_files(task.workspace)}
        job["env"].pop("CLAW_SOLUTION_DIR", None)
    job["mounts"] = mounts
    if hb.get("image_run"):
        job["image_run"] = list(hb["image_run"])
    if hb.get("image_env"):  # the Dockerfile's ENV, for a backend that runs no image
        job["image_env"] = dict(hb["image_env"])
    if "verify" in job:
        tests = {k[len("tests/") :]: v for k, v in task.hidden.items() if k.startswith("tests/")}
        plain = task.verify.name == "tests/test.sh"
        if plain:
            tests["test.sh"] = task.verify.text
        command, vmounts = _verify_mounts(task, tests, None if plain else task.verify.text)
        job["verify"] = {
            "command": _with_artifacts(command, hb.get("artifacts", []), LOGS_ARTIFACTS),
            "timeout_s": task.verify_timeout_s,
            "mounts": vmounts,
            "reward_file": task.reward_file,
            "reset": [LOGS_VERIFIER],  # the verifier's: what the agent left there goes first
        }
    vms = [m for v in [job.get("verify", {}), *job.get("steps", [])] for m in v.get("mounts", [])]
    vms += [m for st in job.get("steps", []) for m in st.get("verify", {}).get("mounts", [])]
    places = [hb["workdir"], *(m["target"] for m in [*mounts, *vms])]
    job["collect"] = [
        c
        for c in job["collect"]
        if not c.startswith("/") or any(c.startswith(p + "/") for p in places)
    ]
    job["collect"] += [f"{LOGS_VERIFIER}/**", f"{LOGS_AGENT}/**", f"{LOGS_ARTIFACTS}/**"]


def plan_jobs(
    tasks: list[Task],
    harnesses: list[Harness],
    *,
    samples: int,
    proxy_url: str | None = None,
    secret: bytes | None = None,
    run_id: str | None = None,
    model: str | None = None,
    install: bool = False,
    group_by: str = "task",
    python: str | None = None,
    limits: dict[str, Any] | None = None,
    network: str | None = None,
) -> list[dict[str, Any]]:
    """claw.job/v1 dicts, one per (task, harness, sample), in task-major order.

    Model harnesses reach the proxy through the sandbox's loopback port (the proxy URL's port;
    ``network="proxy"``, their default) or the proxy URL itself (``"host"``) with a session
    token minted from ``secret`` and tagged {task, harness}. The built-in harnesses (``oracle``,
    ``nothing``) call no model: they get ``network="none"`` unless ``"host"`` is asked for,
    and need no proxy. A task with ``allow_internet = false`` never gets the internet.
    The verifier and hidden files travel in ``verify.files``. ``install`` runs the harness's
    install commands as job setup. ``group_by`` picks the group key: the task (GRPO over all
    harnesses) or ``task+harness`` (key ``<task>+<harness>``, the key claw-tree computes for
    ``--group-by task+harness``). The oracle of a task without a reference solution is planned
    as a no-op job whose meta says why it is ``not_scorable``.
    """
    if samples < 1:
        raise PlanError(f"-n must be at least 1, got {samples}")
    if not tasks:
        raise PlanError("no tasks selected")
    if not harnesses:
        raise PlanError("no harness given (use --harness NAME)")
    if group_by not in GROUP_BY:
        raise PlanError(f"--group-by must be one of {GROUP_BY}, got {group_by!r}")
    if network is not None and network not in NETWORKS:
        raise PlanError(f"--network must be one of {NETWORKS}, got {network!r}")
    model_h = [h.name for h in harnesses if h.needs_model]
    if model_h and (proxy_url is None or secret is None):
        raise PlanError(
            f"harness {model_h[0]} talks to a model: --proxy and --proxy-secret-file are needed"
        )
    port = proxy_port(proxy_url) if proxy_url else None
    run_id = _UNSAFE.sub("_", run_id) if run_id else secrets.token_hex(4)
    python = python or sys.executable
    jobs = []
    for task in tasks:
        for h in harnesses:
            for k in range(samples):
                session = session_id(run_id, task.id, h.name, k)
                net = _network(h, task, network)
                meta = {
                    "session": session,
                    "task": task.id,
                    "harness": h.name,
                    "sample": k,
                    "group": task.id if group_by == "task" else f"{task.id}+{h.name}",
                    "run_id": run_id,
                    "api": h.api,
                }
                files: dict[str, FileContent] = dict(task.workspace)
                env: dict[str, str] = dict(task.meta.get("env", {}))
                verify: dict[str, Any] | None = {
                    "command": task.verify_command(),
                    "timeout_s": task.verify_timeout_s,
                    "files": job_files(task.verify_files()),
                    "reward_file": task.reward_file,
                    "reset": [VERIFY_DIR],  # emptied before the verifier's files are placed
                }
                render: Callable[[str], str] | None = None  # a model harness on an instruction
                if h.needs_model:
                    assert proxy_url is not None and secret is not None and port is not None
                    tags = {"task": task.id, "harness": h.name, "sample": str(k)}
                    token = mint_token(session, secret, tags)
                    base_url = (
                        proxy_url.rstrip("/") if net == "host" else f"http://127.0.0.1:{port}"
                    )
                    values = {
                        "base_url": base_url,
                        "port": str(port),
                        "token": token,
                        "model": model or h.model,
                        "instruction": task.instruction,
                        "instruction_file": ".claw_harness/instruction.md",
                        "python": python,
                        "session": session,
                        "task": task.id,
                        "harness": h.name,
                    }
                    command, h_env, harness_files = h.render(values)
                    clash = set(files) & set(harness_files)
                    if clash:
                        raise PlanError(
                            f"task {task.id}: workspace files {sorted(clash)} clash with harness {h.name}'s files"
                        )
                    files.update(harness_files)
                    env.update(h_env)
                    pre = _preflight(h) if h.requires and not install else ""
                    command = pre + command
                    render = _renderer(h, values, pre)

                elif h.builtin == "oracle":
                    oracle, sol_files, sol_env = _oracle(task)
                    if oracle is None:
                        command, verify = "true", None
                        meta["not_scorable"] = (
                            f"task {task.id} has no reference solution for the oracle"
                        )
                    else:
                        command = oracle
                        files.update(sol_files)
                        env.update(sol_env)
                else:  # nothing, or an adapter with api = "none"
                    command = h.command if not h.builtin else "true"
                setup = [
                    *(h.install if install else ()),
                    *(
                        [
                            f"{task.setup.command(f'.claw_setup/{task.setup.name}')} && rm -rf .claw_setup"
                        ]
                        if task.setup
                        else []
                    ),
                ]
                if task.setup:
                    files[f".claw_setup/{task.setup.name}"] = task.setup.text
                if isinstance(task.meta.get("unsupported"), str):  # e.g. compose sidecars
                    command, verify, setup = "true", None, []
                    meta["not_scorable"] = f"task {task.id} skipped: {task.meta['unsupported']}"
                if task.pass_threshold is not None:
                    meta["pass_threshold"] = task.pass_threshold
                if isinstance(task.meta.get("judge"), dict):
                    meta["judge"] = task.meta[
                        "judge"
                    ]  # the rubric, for claw-bench score's judge step
                net_rec: dict[str, Any] = {"policy": net}
                if net == "proxy":
                    assert proxy_url is not None
                    net_rec.update(proxy_url=proxy_url.rstrip("/"), port=port)
                job: dict[str, Any] = {
                    "schema": JOB,
                    "job_id": session,
                    "workspace": {"files": job_files(files)},
                    "setup": setup,
                    "command": command,
                    "env": env,
                    "timeout_s": task.timeout_s,
                    "network": net_rec,
                    "collect": [task.reward_file, *task.meta.get("collect", [])],
                    "meta": meta,
                }
                if verify is not None:
                    job["verify"] = verify
                if task.image:
                    job["image"] = task.image
                if isinstance(task.meta.get("harbor"), dict):
                    _harbor(job, task, task.meta["harbor"], h, render)
                elif task.meta.get("sessions") and render is not None:
                    _sessions(job, task, h, render)
                task_limits = t if isinstance(t := task.meta.get("limits"), dict) else {}
                if limits or task_limits:
                    job["limits"] = {
                        **task_limits,
                        **(limits or {}),
                    }  # plan's flags override the task's
                jobs.append(job)
    return jobs


def _sessions(job: dict[str, Any], task: Task, h: Harness, render: Callable[..., str]) -> None:
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
    job["steps"] = steps
    job["command"] = steps[0]["command"]
    if not_continued:
        job["meta"]["sessions_not_continued"] = not_continued
