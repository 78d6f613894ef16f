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

import attrs

from claw_bench._choices import GROUP_BY, NETWORKS
from claw_bench._job import JobSpec
from claw_bench._profiles import Profile, Render, profile_for
from claw_bench.errors import PlanError
from claw_bench.harbor import unsupported_reason
from claw_bench.harnesses import Harness
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


@attrs.frozen(kw_only=True)
class _Planner:
    """What every job of one plan shares; :meth:`job` builds the claw.job/v1 of one
    (task, harness, sample) and hands it to the task's profile."""

    proxy_url: str | None
    secret: bytes | None
    run_id: str
    model: str | None
    install: bool
    group_by: str
    python: str
    limits: dict[str, Any] | None
    network: str | None
    timeout_multiplier: float = 1.0
    verify_network: bool = False
    backend: str | None = None  # the claw-sandbox backend the jobs will run on, when known

    @property
    def port(self) -> int | None:
        return proxy_port(self.proxy_url) if self.proxy_url else None

    def job(self, task: Task, profile: Profile, h: Harness, k: int) -> dict[str, Any]:
        session = session_id(self.run_id, task.id, h.name, k)
        net = _network(h, task, self.network)
        meta: dict[str, Any] = {
            "session": session,
            "task": task.id,
            "harness": h.name,
            "sample": k,
            "group": task.id if self.group_by == "task" else f"{task.id}+{h.name}",
            "run_id": self.run_id,
            "api": h.api,
        }
        files: dict[str, FileContent] = dict(task.workspace)
        env: dict[str, str] = dict(task.meta.get("env", {}))
        verify: dict[str, Any] | None = _verify(task)
        render: Render | None = None  # a model harness on an instruction
        if h.needs_model:
            command, render = self._model_command(task, h, k, session, net, files, env)
        elif h.builtin == "oracle":
            oracle, sol_files, sol_env = _oracle(task)
            if oracle is None:
                command, verify = "true", None
                meta["not_scorable"] = f"task {task.id} has no reference solution for the oracle"
            else:
                command = oracle
                files.update(sol_files)
                env.update(sol_env)
        else:  # nothing, or an adapter with api = "none"
            command = h.command if not h.builtin else "true"
        setup = self._setup(task, h, files)
        unsupported = unsupported_reason(task.meta, self.backend)
        if unsupported is not None:  # e.g. compose sidecars, off docker
            command, verify, setup = "true", None, []
            meta["not_scorable"] = f"task {task.id} skipped: {unsupported}"
        if task.pass_threshold is not None:
            meta["pass_threshold"] = task.pass_threshold
        if isinstance(task.meta.get("judge"), dict):
            meta["judge"] = task.meta["judge"]  # the rubric, for claw-bench score's judge step
        if isinstance(task.meta.get("officeqa"), dict):
            meta["officeqa"] = task.meta["officeqa"]  # the true answer, for claw-bench score
        spec = JobSpec(
            job_id=session,
            workspace=job_files(files),
            setup=setup,
            command=command,
            env=env,
            timeout_s=task.timeout_s,
            network=self._network_record(net),
            collect=[task.reward_file, *task.meta.get("collect", [])],
            meta=meta,
            verify=verify,
            image=task.image or None,
        )
        spec = profile.job(spec, task, h, render)
        compose = task.meta.get("compose")
        if unsupported is None and isinstance(compose, dict) and compose.get("job_services"):
            spec = attrs.evolve(spec, services=compose["job_services"])  # started by docker
        task_limits = t if isinstance(t := task.meta.get("limits"), dict) else {}
        if self.limits or task_limits:  # plan's flags override the task's
            spec = attrs.evolve(spec, limits={**task_limits, **(self.limits or {})})
        if self.verify_network and task.meta.get("allow_internet") is True:
            spec = _verify_network(spec)
        if self.timeout_multiplier != 1.0:
            spec = scale_timeouts(spec, self.timeout_multiplier)
        return spec.to_dict()

    def _model_command(
        self,
        task: Task,
        h: Harness,
        k: int,
        session: str,
        net: str,
        files: dict[str, FileContent],
        env: dict[str, str],
    ) -> tuple[str, Render]:
        """A model harness's command, with a session token for the proxy; its files and env are
        added to ``files`` and ``env``."""
        assert self.proxy_url is not None and self.secret is not None and self.port is not None
        tags = {"task": task.id, "harness": h.name, "sample": str(k)}
        token = mint_token(session, self.secret, tags)
        base_url = self.proxy_url.rstrip("/") if net == "host" else f"http://127.0.0.1:{self.port}"
        values = {
            "base_url": base_url,
            "port": str(self.port),
            "token": token,
            "model": self.model or h.model,
            "instruction": task.instruction,
            "instruction_file": ".claw_harness/instruction.md",
            "python": self.python,
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
        pre = _preflight(h) if h.requires and not self.install else ""
        return pre + command, _renderer(h, values, pre)

    def _setup(self, task: Task, h: Harness, files: dict[str, FileContent]) -> list[str]:
        """The job's setup: the harness's install (with ``install``), then the task's setup
        script, which is added to ``files``."""
        setup = list(h.install) if self.install else []
        if task.setup:
            files[f".claw_setup/{task.setup.name}"] = task.setup.text
            setup.append(
                f"{task.setup.command(f'.claw_setup/{task.setup.name}')} && rm -rf .claw_setup"
            )
        return setup

    def _network_record(self, net: str) -> dict[str, Any]:
        rec: dict[str, Any] = {"policy": net}
        if net == "proxy":
            assert self.proxy_url is not None
            rec.update(proxy_url=self.proxy_url.rstrip("/"), port=self.port)
        return rec


def _verify_steps(spec: JobSpec, change: Callable[[dict[str, Any]], dict[str, Any]]) -> JobSpec:
    """``spec`` with ``change`` applied to its verify step and each step's."""
    verify = change(spec.verify) if spec.verify is not None else None
    steps = None
    if spec.steps is not None:
        steps = [
            {**st, "verify": change(st["verify"])} if st.get("verify") else st for st in spec.steps
        ]
    return attrs.evolve(spec, verify=verify, steps=steps)


def _verify_network(spec: JobSpec) -> JobSpec:
    """``plan --verify-network``: the job's verify steps get the host's network (the task allows
    the internet), whatever the agent's steps get."""
    return _verify_steps(spec, lambda v: {**v, "network": {"policy": "host"}})


def scale_timeouts(spec: JobSpec, factor: float) -> JobSpec:
    """Harbor's ``--timeout-multiplier``: every timeout of the job (the agent's command, each
    step's, each verify step's) times ``factor``; ``meta.timeout_multiplier`` records it."""
    spec = _verify_steps(spec, lambda v: {**v, "timeout_s": v["timeout_s"] * factor})
    steps = spec.steps
    if steps is not None:
        steps = [{**st, "timeout_s": st["timeout_s"] * factor} for st in steps]
    meta = {**spec.meta, "timeout_multiplier": factor}
    return attrs.evolve(spec, timeout_s=spec.timeout_s * factor, steps=steps, meta=meta)


def _verify(task: Task) -> dict[str, Any]:
    """The job's verify step: the verifier and hidden files placed in the workspace at verify
    time only."""
    return {
        "command": task.verify_command(),
        "timeout_s": task.verify_timeout_s,
        "files": job_files(task.verify_files()),
        "reward_file": task.reward_file,
        "reset": [VERIFY_DIR],  # emptied before the verifier's files are placed
    }


def _check_plan(
    harnesses: list[Harness],
    samples: int,
    tasks: list[Task],
    group_by: str,
    network: str | None,
    proxy_url: str | None,
    secret: bytes | None,
) -> None:
    """PlanError for arguments no job can be planned from."""
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
    if proxy_url:
        proxy_port(proxy_url)


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
    timeout_multiplier: float = 1.0,
    verify_network: bool = False,
    backend: str | None = None,
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
    as a no-op job whose meta says why it is ``not_scorable``. ``timeout_multiplier`` scales
    every timeout of every job (Harbor's ``--timeout-multiplier``); ``verify_network`` gives the
    verify steps of tasks whose ``allow_internet`` is true the host's network
    (claw.job/v1 ``verify.network``; Harbor's verifier runs with the task's network).
    ``backend`` is the claw-sandbox backend the jobs will run on: with ``"docker"`` a Harbor task's
    compose sidecars become the job's ``services``; elsewhere (or unknown) such a task is planned
    as ``not_scorable`` no-op jobs with the reason.
    """
    if not timeout_multiplier > 0:
        raise PlanError(f"--timeout-multiplier must be > 0, got {timeout_multiplier}")
    _check_plan(harnesses, samples, tasks, group_by, network, proxy_url, secret)
    planner = _Planner(
        proxy_url=proxy_url,
        secret=secret,
        run_id=_UNSAFE.sub("_", run_id) if run_id else secrets.token_hex(4),
        model=model,
        install=install,
        group_by=group_by,
        python=python or sys.executable,
        limits=limits,
        network=network,
        timeout_multiplier=timeout_multiplier,
        verify_network=verify_network,
        backend=backend,
    )
    jobs: list[dict[str, Any]] = []
    for task in tasks:
        profile = profile_for(task)  # chosen once per task
        for h in harnesses:
            jobs.extend(planner.job(task, profile, h, k) for k in range(samples))
    return jobs
