"""One job, start to end: workspace, setup, command, hidden verify files, verify, collect, discard."""

from __future__ import annotations

import asyncio
import errno
import re
import shlex
import threading
import time
import uuid
from pathlib import Path

from claw_sandbox import _fsat, _hostpaths, _leftovers
from claw_sandbox.backends.base import Backend, Sandbox
from claw_sandbox.errors import InfraError, JobError
from claw_sandbox.records import Command, Job, Run, Verify, VerifyResult
from claw_sandbox.workspace import collect, parse_reward, read_file


def jobdir_for(root: Path, job_id: str) -> Path:
    # Readable and bounded; the uuid keeps directories of jobs with the same prefix apart.
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", job_id)[:32] or "job"
    return root / f"{safe}-{uuid.uuid4().hex[:8]}"


async def execute_job(job: Job, backend: Backend, root: Path) -> tuple[Run, str | None]:
    """Run one job once. Returns the run and the kept job directory (or None).

    Raises InfraError when the sandbox could not be set up or started (the caller retries);
    an invalid job (bad copy_from, ...) comes back as a `status: error` run.
    """
    started = time.time()
    sandbox = backend.sandbox(job, jobdir_for(root, job.job_id))
    fields: dict = {"status": "error", "exit_code": None, "verify": None, "error": None}
    out = err = ""
    collected: dict[str, str] = {}
    started_sandbox = False
    try:
        backend.check_job(job)
        try:
            if job.copy_from:  # copying a tree may take a while: keep the event loop free
                await asyncio.to_thread(sandbox.prepare)
            else:  # a few inline files: cheaper than a thread hop
                sandbox.prepare()
        except OSError as exc:
            raise InfraError(f"cannot create the job directory: {exc}") from exc
        started_sandbox = True  # stop() also cleans up a half-done start()
        await sandbox.start()
        fields, out, err = await _steps(job, sandbox)
        if job.collect:
            collected = await _collect(job, sandbox)
    except JobError as exc:
        fields["error"] = str(exc)
    except BaseException:
        await _teardown(sandbox, started_sandbox, keep=False)
        raise
    if sandbox.notes:
        note = "; ".join(dict.fromkeys(sandbox.notes))
        fields["error"] = f"{fields['error']}; {note}" if fields["error"] else note
    failed = fields["status"] != "ok" or not (fields["verify"] is None or fields["verify"].passed)
    keep = job.keep == "always" or (job.keep == "failed" and failed)
    await _teardown(sandbox, started_sandbox, keep)
    run = Run(
        job_id=job.job_id, started_at=started, ended_at=time.time(), stdout_tail=out, stderr_tail=err,
        collected=collected, backend=backend.name, meta=dict(job.meta),
        limits=sandbox.limits.bounds(), **fields,
        image_run_skipped=() if backend.builds_images else job.image_run,
    )  # fmt: skip
    return run, str(sandbox.jobdir) if keep else None


async def _collect(job: Job, sandbox: Sandbox) -> dict[str, str]:
    """Collect in a thread; on cancellation (SIGTERM, Ctrl-C) tell the thread to stop, so the
    interpreter's exit does not wait for a long walk."""
    stop = threading.Event()
    await sandbox.sync_out()
    groups: dict[Path, tuple[str, list[str]]] = {}  # host dir -> (its place in the job, globs)
    for g in job.collect:
        place = sandbox.host_root(g)
        if place is None:
            continue
        root, rel = place
        prefix = g[: len(g) - len(rel)] if g.startswith("/") else ""
        groups.setdefault(root, (prefix.rstrip("/") + "/" if prefix else "", []))[1].append(rel)
    collected: dict[str, str] = {}
    files_left, bytes_left = job.limits.collect_files, job.limits.collect_bytes
    try:
        for root, (prefix, globs) in groups.items():
            got, note = await asyncio.to_thread(
                collect, root, globs, max_files=files_left, max_bytes=bytes_left, stop=stop,
            )  # fmt: skip
            collected.update({prefix + k: v for k, v in got.items()})
            files_left -= len(got)
            bytes_left -= sum(len(v.encode()) for v in got.values())
            if note:
                sandbox.notes.append(note)
    except BaseException:
        stop.set()
        raise
    return collected


async def _teardown(sandbox: Sandbox, started: bool, keep: bool) -> None:
    try:
        if started:
            await sandbox.stop()
        if not keep and not sandbox.remove_if_untouched():
            await asyncio.to_thread(sandbox.remove)
    finally:  # unlocked, a directory still there is removed by the next run (unless kept)
        _leftovers.release(sandbox.lock, sandbox.jobdir, kept=keep)
        sandbox.lock = None


async def _steps(job: Job, sandbox: Sandbox) -> tuple[dict, str, str]:
    deadline = time.monotonic() + job.timeout_s
    for i, step in enumerate(job.setup, start=1):
        r = await sandbox.run(step, timeout_s=max(0.001, deadline - time.monotonic()))
        if r.timed_out:
            msg = f"setup step {i} timed out (the job's timeout_s={job.timeout_s:g} covers setup)"
            return (
                {"status": "timeout", "exit_code": None, "verify": None, "error": msg},
                r.stdout,
                r.stderr,
            )
        if r.exit_code != 0:
            tail = r.stderr.strip().splitlines()[-1:] or r.stdout.strip().splitlines()[-1:]
            msg = f"setup step {i} exited with {r.exit_code}" + (f": {tail[0]}" if tail else "")
            return (
                {"status": "error", "exit_code": None, "verify": None, "error": msg},
                r.stdout,
                r.stderr,
            )
    if job.steps:
        return await _run_steps(job, sandbox)
    await _check_program(job, sandbox, job.command, deadline)
    r = await sandbox.run(job.command, timeout_s=max(0.001, deadline - time.monotonic()))
    fields: dict = {
        "status": "timeout" if r.timed_out else "ok",
        "exit_code": r.exit_code,
        "verify": None,
        "error": f"command timed out after {job.timeout_s:g}s" if r.timed_out else None,
    }
    if job.verify is not None:
        fields["verify"] = await _verify(job, sandbox)
    return fields, r.stdout, r.stderr


#: how much of each step's output its record in the run keeps (the run's tails are the last step's)
STEP_TAIL_CHARS = 2000
#: how long the runner's lookup of the command's program may take (within the job's timeout)
LOOKUP_TIMEOUT_S = 30.0
# a program name the lookup may ask about: no shell expansion, quoting or redirection in it
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.+@%,:/-]+")


def launched_program(command: Command) -> str | None:
    """The program a command starts first, as the runner looks it up (`_check_program`): a
    list's argv[0]; a shell string's first simple command's first word, after assignments and
    prefixes (``exec``, ``env``, ``command -v``: so the name a ``command -v NAME || exit 127``
    guard checks). None where only the shell could tell: a word with expansions, quotes or
    redirections, a function the command defines, a string the shell would refuse."""
    if not isinstance(command, str):
        return command[0] if command else None
    lex = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return None
    for i, tok in enumerate(tokens):
        if tok in _hostpaths._SEPARATORS or tok in _hostpaths._PREFIXES:
            continue
        after = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok.startswith("-"):
            continue  # an option of a prefix (command -v, env -i)
        if _hostpaths._ASSIGNMENT.match(tok):
            value = tok.partition("=")[2]
            if after.startswith("(") or not _PLAIN_NAME.fullmatch(value or "x"):
                return None  # `p=$(...)`, `A="x y"`: the shell decides
            continue
        if after.startswith("(") or not _PLAIN_NAME.fullmatch(tok):
            return None  # `f() { ...; }` defines f; `$X`, `>file`: the shell decides
        return tok
    return None


async def _check_program(job: Job, sandbox: Sandbox, command: Command, deadline: float) -> None:
    """Before the first agent command, while no agent process has run: the runner looks up the
    program it starts (`Sandbox.lookup`), and a program that is not there makes the run an
    `error` (JobError) without running it. This, never the command's exit code (126 / 127 are
    codes any agent can exit with, or make its shell exit with), is what says a harness could
    not start."""
    name = launched_program(command)
    if name is None:
        return
    found = await sandbox.lookup(
        name, command, timeout_s=max(0.001, min(LOOKUP_TIMEOUT_S, deadline - time.monotonic()))
    )
    if found is False:
        path = sandbox.env().get("PATH")
        where = f"PATH={path}" if path is not None else "the image's PATH"
        raise JobError(
            f"job {job.job_id!r}: command: {name!r} was not found in the job's environment "
            f"({where}; looked up by the runner before the command ran): the command did not run"
        )


def step_rewards(v: VerifyResult) -> dict[str, float]:
    """A verified step's named rewards, as Harbor gates them: the reward file's keys when it held
    an object, else {"reward": reward}."""
    subs = {
        k: float(x)
        for k, x in v.details.items()
        if isinstance(x, int | float) and not isinstance(x, bool)
    }
    if subs:
        return subs
    return {"reward": float(v.reward)} if v.reward is not None else {}


def gate_met(min_reward: float | dict[str, float], rewards: dict[str, float]) -> bool:
    """Harbor's `min_reward`: a number gates the ``reward`` key, an object each of its keys; a
    missing key counts as -inf."""
    gates = {"reward": min_reward} if isinstance(min_reward, float) else min_reward
    return all(rewards.get(k, float("-inf")) >= g for k, g in gates.items())


async def _run_steps(job: Job, sandbox: Sandbox) -> tuple[dict, str, str]:
    """A job's `steps`, in order in its one sandbox: each step's files and mounts, setup, command
    and verify; a step whose reward misses its `min_reward` (or whose setup fails) ends them."""
    records: list[dict] = []
    out = err = ""
    status, exit_code, error = "ok", None, None
    last_verify: VerifyResult | None = None
    for i, step in enumerate(job.steps):
        t0 = time.monotonic()
        rec: dict = {"name": step.name, "status": "ok", "exit_code": None, "verify": None}
        records.append(rec)
        await asyncio.to_thread(sandbox.begin_step, step, i)
        deadline = t0 + step.timeout_s
        failed = None
        for k, cmd in enumerate(step.setup, start=1):
            r = await sandbox.run(cmd, timeout_s=max(0.001, deadline - time.monotonic()))
            if r.timed_out or r.exit_code != 0:
                tail = r.stderr.strip().splitlines()[-1:] or r.stdout.strip().splitlines()[-1:]
                failed = (
                    f"step {step.name!r}: setup {k} "
                    + ("timed out" if r.timed_out else f"exited with {r.exit_code}")
                    + (f": {tail[0]}" if tail else "")
                )
                out, err = r.stdout, r.stderr
                break
        if failed:
            rec.update(status="error", error=failed)
            status, error = "error", failed
            break
        if i == 0:  # later steps run after the agent has: their exit codes are the agent's
            await _check_program(job, sandbox, step.command, deadline)
        r = await sandbox.run(step.command, timeout_s=max(0.001, deadline - time.monotonic()))
        out, err = r.stdout, r.stderr
        rec.update(
            status="timeout" if r.timed_out else "ok",
            exit_code=r.exit_code,
            stdout_tail=r.stdout[-STEP_TAIL_CHARS:],
            stderr_tail=r.stderr[-STEP_TAIL_CHARS:],
        )
        if r.timed_out:
            rec["error"] = f"step {step.name!r}: command timed out after {step.timeout_s:g}s"
            status, error = "timeout", rec["error"]
        exit_code = r.exit_code
        if step.verify is not None:
            v = await _verify(job, sandbox, step.verify)
            rec["verify"] = v.to_dict()
            last_verify = v
            if step.min_reward is not None:
                met = gate_met(step.min_reward, step_rewards(v))
                rec["min_reward"] = {"threshold": step.min_reward, "met": met}
                if not met:
                    rec["duration_s"] = round(time.monotonic() - t0, 6)
                    break
            if i + 1 < len(job.steps):
                await asyncio.to_thread(sandbox.end_verify)
        rec["duration_s"] = round(time.monotonic() - t0, 6)
    fields: dict = {"status": status, "exit_code": exit_code, "verify": None, "error": error}
    if job.verify is not None and status != "error":
        fields["verify"] = await _verify(job, sandbox, job.verify)
    elif last_verify is not None:
        fields["verify"] = last_verify  # readers that do not know `steps` see the last one
    fields["steps"] = tuple(records)
    return fields, out, err


#: a verifier that ended so yields no reward: 128 + SIGKILL (the memory limit, the runner)
KILLED_EXIT = 137


async def _verify(job: Job, sandbox: Sandbox, verify: Verify | None = None) -> VerifyResult:
    """Run a verify step. Its reward is what the verifier wrote during it, and nothing else: the
    places it owns are cleared first (`Sandbox.clear_for_verify`), and a verifier that timed out
    or was killed yields reward null with the reason in `details.no_reward`."""
    verify = verify or job.verify
    assert verify is not None
    try:
        await asyncio.to_thread(sandbox.clear_for_verify, verify)
    except OSError as exc:
        why = f"the verifier's places could not be cleared ({exc}); the verifier did not run"
        return VerifyResult(exit_code=None, passed=False, reward=None, details={"no_reward": why})
    await asyncio.to_thread(sandbox.place_verify_files, verify)
    r = await sandbox.run(verify.command, timeout_s=verify.timeout_s, merge_stderr=True)
    if r.timed_out or r.exit_code is None or r.exit_code == KILLED_EXIT:
        why = (
            f"the verifier timed out after {verify.timeout_s:g}s"
            if r.timed_out
            else f"the verifier was killed (exit {r.exit_code})"
        )
        return VerifyResult(
            exit_code=r.exit_code, passed=False, reward=None, output=r.stdout,
            details={"no_reward": f"{why}: no reward file is read"}, timed_out=r.timed_out,
        )  # fmt: skip
    passed = r.exit_code == 0
    reward: float = 1.0 if passed else 0.0
    details: dict = {}
    if verify.reward_file:
        await sandbox.sync_out()
        reward, details = _read_reward(sandbox, verify.reward_file, reward)
    return VerifyResult(
        exit_code=r.exit_code, passed=passed, reward=reward, details=details, output=r.stdout,
    )  # fmt: skip


def _read_reward(sandbox: Sandbox, path: str, by_exit: float) -> tuple[float, dict]:
    """The reward file's reward and sub-scores (bounded read, no link followed); `by_exit` when
    the verifier wrote none; 0 with `reward_file_error` when it is unusable."""
    root, rel = sandbox.host_root(path) or (sandbox.workspace, "")
    try:  # no link is followed: a `reward -> /host/secret` the verifier made is not read
        data = read_file(root, rel)
    except FileNotFoundError:
        return by_exit, {}  # no reward file: the reward is the verify step's pass/fail
    except _fsat.NotRegularFile:
        return 0.0, {"reward_file_error": f"{rel}: not a regular file"}
    except OSError as exc:
        why = "a symlink on its path" if exc.errno == errno.ELOOP else exc.strerror
        return 0.0, {"reward_file_error": f"{rel}: not read ({why})"}
    try:
        return parse_reward(data.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return 0.0, {"reward_file_error": f"{rel}: {exc}"}
