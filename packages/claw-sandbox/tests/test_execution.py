"""The job lifecycle on every local backend: workspace, setup, command, verify, collect, cleanup."""

import base64
import hashlib
import os
import signal
import subprocess
import time
import uuid

import pytest
from claw_sandbox import _cgroup, run_jobs
from claw_sandbox.backends.process import ProcessBackend
from sandbox_testlib import alive_with, job, py


@pytest.fixture(scope="module")
def process_without_cgroups():
    """The process backend as on a machine without a writable cgroup tree (rlimits, env marker)."""
    backend = ProcessBackend()
    backend.cgroups = _cgroup.CgroupSupport(None, reason="disabled for this test")
    return backend


@pytest.fixture(params=["bwrap", "process", "process_without_cgroups"])
def backend(request):
    return request.getfixturevalue(request.param)


def _one(backend, row, tmp_path):
    (run,) = run_jobs([row], backend=backend, workdir=tmp_path / "w")
    return run


def test_full_lifecycle_with_reward_file_and_collect(backend, tmp_path):
    """Setup then command then verify see one workspace; reward file and globs come back."""
    row = job(
        "life",
        workspace={"files": {"task.txt": "2 3\n"}},
        setup=["mkdir -p out", ["sh", "-c", "echo setup > out/setup.txt"]],
        command="read a b < task.txt; echo $((a*b)) > out/answer.txt; echo done; echo warn >&2",
        verify={
            "command": 'test "$(cat out/answer.txt)" = 6 && echo \'{"answer": 1, "style": 0.5}\' > .v/reward',
            "files": {".v/keep": "x"},
            "reward_file": ".v/reward",
        },
        collect=["out/*.txt"],
        meta={"task": "mul"},
    )
    run = _one(backend, row, tmp_path)
    assert run["status"] == "ok" and run["exit_code"] == 0, run
    assert run["stdout_tail"] == "done\n" and run["stderr_tail"] == "warn\n"
    assert run["verify"]["passed"] and run["verify"]["reward"] == 0.75
    assert run["verify"]["details"] == {"answer": 1.0, "style": 0.5}
    assert run["collected"] == {"out/answer.txt": "6\n", "out/setup.txt": "setup\n"}
    assert run["meta"] == {"task": "mul"} and run["backend"] == backend.name
    assert not (tmp_path / "w").exists() or os.listdir(tmp_path / "w") == []


def test_verify_files_are_hidden_from_the_command(backend, tmp_path):
    """The command cannot see the verifier's files; the verifier can; no reward file -> exit code."""
    row = job(
        "hidden",
        command="ls -a; test ! -e .verify",
        verify={
            "command": "test -f .verify/check.sh && exit 3",
            "files": {".verify/check.sh": "exit 0"},
        },
    )
    run = _one(backend, row, tmp_path)
    assert run["exit_code"] == 0, run
    assert run["verify"] == {**run["verify"], "exit_code": 3, "passed": False, "reward": 0.0}


def test_binary_files_arrive_byte_exact(backend, tmp_path):
    """Workspace and verify files given as base64 are written with their exact bytes."""
    data = bytes(range(256)) * 4
    b64 = {"content_b64": base64.b64encode(data).decode()}
    digest = hashlib.sha256(data).hexdigest()
    row = job(
        "bin",
        workspace={"files": {"in/a.bin": b64}},
        command=f'test "$(sha256sum in/a.bin | cut -c1-64)" = {digest}',
        verify={
            "command": f'test "$(sha256sum t/d.bin | cut -c1-64)" = {digest}',
            "files": {"t/d.bin": b64},
        },
    )
    run = _one(backend, row, tmp_path)
    assert run["exit_code"] == 0 and run["verify"]["passed"], run


def test_failing_setup_and_failing_command(backend, tmp_path):
    """A failing setup step is a job error; a failing command is status ok with its exit code."""
    bad = _one(backend, job("s", setup=["echo nope >&2; exit 4"], command="true"), tmp_path)
    assert bad["status"] == "error" and bad["error"] == "setup step 1 exited with 4: nope"
    failed = _one(backend, job("c", command="exit 7", verify={"command": "true"}), tmp_path)
    assert failed["status"] == "ok" and failed["exit_code"] == 7 and failed["verify"]["passed"]


def test_timeout_kills_the_whole_tree_including_daemons(backend, tmp_path):
    """A job that forks, daemonizes (setsid, double fork) and hangs is killed entirely."""
    token = f"{uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 10**6}"
    command = (
        f"(setsid sleep {token} &); (nohup sh -c 'sleep {token}' >/dev/null 2>&1 &); sleep {token}"
    )
    run = _one(
        backend, job("t", command=command, timeout_s=1, verify={"command": "true"}), tmp_path
    )
    assert run["status"] == "timeout" and run["exit_code"] is None
    assert run["verify"]["passed"], "verify still judges the final state after a timeout"
    assert alive_with(f"sleep {token}") == []


def test_orphan_detector_sees_a_daemon_outside_any_sandbox():
    """Control for the two tests above: the same daemonizing command, unsandboxed, survives."""
    token = f"{uuid.uuid4().int % 10**6}.75"
    subprocess.run(["bash", "-c", f"(setsid sleep {token} >/dev/null 2>&1 &)"], check=True)
    deadline = time.monotonic() + 5
    while not (pids := alive_with(f"sleep {token}")) and time.monotonic() < deadline:
        time.sleep(0.01)  # the detached child may not have exec'd sleep yet
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert len(pids) == 1


def test_daemon_left_by_a_finished_command_is_killed(backend, tmp_path):
    """When the command exits normally, anything it left running is killed too."""
    token = f"{uuid.uuid4().int % 10**6}.5"
    run = _one(
        backend, job("d", command=f"(setsid sleep {token} >/dev/null 2>&1 &); echo bye"), tmp_path
    )
    assert run["status"] == "ok" and run["stdout_tail"] == "bye\n"
    assert alive_with(f"sleep {token}") == []


def test_output_tails_are_bounded(backend, tmp_path):
    """limits.output_bytes keeps only the last bytes of each stream."""
    run = _one(
        backend,
        job("o", command=py("print('x' * 10000 + 'END')"), limits={"output_bytes": 10}),
        tmp_path,
    )
    assert run["stdout_tail"] == "xxxxxxEND\n"


def test_keep_failed_keeps_the_sandbox(backend, tmp_path):
    """keep: failed leaves a failed job's directory for debugging, and only that one."""
    runs = run_jobs(
        [job("bad", command="echo x > f; exit 1", verify={"command": "false"}, keep="failed"),
         job("good", command="true", keep="failed")],
        backend=backend, workdir=tmp_path / "w",
    )  # fmt: skip
    assert {r["job_id"] for r in runs} == {"bad", "good"}
    kept = os.listdir(tmp_path / "w")
    assert len(kept) == 1 and kept[0].startswith("bad-")
    assert (tmp_path / "w" / kept[0] / "ws" / "f").read_text() == "x\n"


def test_job_directories_are_removed_whatever_the_job_left(backend, tmp_path):
    """Nothing left (the quick rmdir path), files in HOME, or a symlink planted in place of HOME:
    every job directory goes, and the symlink's target is not followed."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("k")
    runs = run_jobs(
        [job("none", command="true"), job("files", command='echo x > "$HOME/f"; mkdir -p d/e'),
         job("link", command=f'rm -r "$HOME" && ln -s {target} "$HOME"')],
        backend=backend, workdir=tmp_path / "w",
    )  # fmt: skip
    assert [r["status"] for r in runs] == ["ok"] * 3 and [r["exit_code"] for r in runs] == [0] * 3
    assert os.listdir(tmp_path / "w") == []
    assert (target / "keep.txt").read_text() == "k"


def test_env_is_clean_and_job_env_is_set(backend, tmp_path, monkeypatch):
    """The runner's environment does not leak; the job's env and CLAW_* variables are set."""
    monkeypatch.setenv("RUNNER_SECRET", "s3cret")
    run = _one(backend, job("e", command="env", env={"MY_VAR": "v"}), tmp_path)
    assert "s3cret" not in run["stdout_tail"]
    assert "MY_VAR=v" in run["stdout_tail"] and "CLAW_JOB_ID=e" in run["stdout_tail"]
