"""Only the runner decides that a job could not be carried out, from what it saw itself: an agent
command's exit code (126 and 127 included) is the agent's, a failed rollout its verifier scores;
a harness program missing from the job's environment is found by the runner's own lookup before
any agent process runs (a run with `status: error`). And the job cannot ptrace: an agent cannot
make its parent shell exit with a code of its choosing."""

import platform
import shlex

import pytest
from claw_sandbox import executor, run_jobs
from sandbox_testlib import job, py

# Attach to the parent shell (bash -c, waiting for this process), stop it at the entry of its
# restarted wait4 and turn that syscall into exit_group(127): the attack (x86_64).
ATTACK = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
ppid = os.getppid()
if libc.ptrace(16, ppid, None, None) != 0:  # PTRACE_ATTACH
    print("ptrace:", errno.errorcode[ctypes.get_errno()], flush=True)
    raise SystemExit(0)
os.waitpid(ppid, 0)
libc.ptrace(24, ppid, None, None)  # PTRACE_SYSCALL: stop at the next syscall entry
os.waitpid(ppid, 0)
regs = (ctypes.c_ulonglong * 27)()
libc.ptrace(12, ppid, None, ctypes.byref(regs))  # PTRACE_GETREGS
regs[15], regs[14] = 231, 127  # orig_rax = exit_group, rdi = 127
libc.ptrace(13, ppid, None, ctypes.byref(regs))  # PTRACE_SETREGS
libc.ptrace(17, ppid, None, None)  # PTRACE_DETACH
print("ptrace: attached", flush=True)
"""
VERIFY = {"command": "exit 1", "timeout_s": 30}


def _runs(backend, rows, tmp_path) -> dict:
    runs = run_jobs(rows, backend=backend, retries=0, workdir=tmp_path / "jobs")
    return {r["job_id"]: r for r in runs}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack sets x86_64 registers")
def test_attack_works_without_the_filter(process, tmp_path):
    """The reference: on the process backend (no seccomp, no isolation) the attack does make the
    parent shell exit 127, so the bwrap case below tests the filter, not a broken attack."""
    row = job("attack", command=f"{shlex.join(py(ATTACK))}; echo survived", verify=VERIFY)
    run = _runs(process, [row], tmp_path)["attack"]
    assert run["exit_code"] == 127 and "survived" not in run["stdout_tail"], run
    assert run["status"] == "ok" and run["verify"]["reward"] == 0.0, run


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack sets x86_64 registers")
def test_ptrace_is_denied_on_bwrap(bwrap, tmp_path):
    """On bwrap the job's ptrace gets EPERM: the parent shell is not touched and goes on."""
    row = job("attack", command=f"{shlex.join(py(ATTACK))}; echo survived", verify=VERIFY)
    run = _runs(bwrap, [row], tmp_path)["attack"]
    assert "ptrace: EPERM" in run["stdout_tail"] and "survived" in run["stdout_tail"], run
    assert run["exit_code"] == 0, run


@pytest.mark.parametrize("name", ["bwrap", "process"])
def test_missing_program_is_found_by_the_runner_before_the_agent(name, request, tmp_path):
    """A command whose program is not in the job's environment: `status: error` naming it, the
    command and verifier never run. A command that merely exits 126 / 127 (any agent can) is an
    ordinary `ok` run whose verifier runs and scores it."""
    backend = request.getfixturevalue(name)
    rows = [
        job("missing", command="claw-no-such-tool --task x", verify=VERIFY),
        job("missing-list", command=["claw-no-such-tool", "--task"], verify=VERIFY),
        job("exit127", command="echo 'sh: claude: command not found' >&2; exit 127", verify=VERIFY),
        job("exit126", command="exit 126", verify=VERIFY),
        job("preflight", command="command -v claw-no-such-tool >/dev/null || exit 127; true"),
    ]
    runs = _runs(backend, rows, tmp_path)
    for jid in ("missing", "missing-list", "preflight"):
        run = runs[jid]
        assert run["status"] == "error" and run["exit_code"] is None, run
        assert run["verify"] is None and "'claw-no-such-tool'" in run["error"], run
        assert "not found in the job's environment" in run["error"], run
    for jid, code in (("exit127", 127), ("exit126", 126)):
        run = runs[jid]
        assert run["status"] == "ok" and run["exit_code"] == code and run["error"] is None, run
        assert run["verify"]["reward"] == 0.0 and run["verify"]["passed"] is False, run


def test_programs_the_shell_defines_are_not_looked_up(process, tmp_path):
    """Builtins, keywords, a function the command defines, a name from a variable, a program
    that setup installs: the lookup never refuses them."""
    rows = [
        job("builtin", command="cd . && true"),
        job("keyword", command="for x in 1; do true; done"),
        job("function", command="f() { true; }; f"),
        job("variable", command="$PROG -c true", env={"PROG": "/bin/sh"}),
        job("installed", command="./tool", setup=["printf '#!/bin/sh\\n' > tool; chmod +x tool"]),
    ]
    runs = _runs(process, rows, tmp_path)
    for jid, run in runs.items():
        assert run["status"] == "ok" and run["exit_code"] == 0, (jid, run)


def test_launched_program():
    """The program a command starts first: argv[0]; a shell string's first simple command's
    first word (after assignments and `command -v`); None where the shell decides."""
    assert executor.launched_program(["/usr/bin/env", "x"]) == "/usr/bin/env"
    assert executor.launched_program("A=1 mini --x") == "mini"
    assert executor.launched_program("command -v mini >/dev/null || exit 127; mini") == "mini"
    assert executor.launched_program("f() { :; }; f") is None
    assert executor.launched_program("$HARNESS run") is None
    assert executor.launched_program("'unclosed") is None
    assert executor.launched_program("") is None


@pytest.mark.parametrize("name", ["bwrap", "process"])
def test_steps_exit_code_is_the_last_steps(name, request, tmp_path):
    """A multi-step run's exit code is its last step's: an earlier step's 127 is not kept as a
    sign that the harness never started (only the runner's lookup says that)."""
    backend = request.getfixturevalue(name)
    row = job(
        "steps",
        steps=[
            {"name": "a", "command": "exit 127", "verify": VERIFY},
            {"name": "b", "command": "true", "verify": VERIFY},
        ],
    )
    run = _runs(backend, [row], tmp_path)["steps"]
    assert run["status"] == "ok" and run["exit_code"] == 0, run
    assert [s["exit_code"] for s in run["steps"]] == [127, 0], run


def test_assignments_with_expansions_are_left_to_the_shell():
    """`p=$(command -v x) || ...` (claw-sandbox doctor's check) and quoted values start no
    program the runner could name."""
    assert executor.launched_program("p=$(command -v x) || { echo no; exit 1; }") is None
    assert executor.launched_program('A="x y" mini') is None
    assert executor.launched_program("A= mini") == "mini"
