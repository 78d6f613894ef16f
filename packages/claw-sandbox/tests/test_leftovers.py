"""Job directories left by a runner killed with SIGKILL are removed by the next run; live and
kept ones are not."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from claw_sandbox import _leftovers, run_jobs
from sandbox_testlib import alive_with, job, py


def _jobdir(root, name):
    d = root / name
    (d / "ws").mkdir(parents=True)
    (d / "ws" / "f").write_text("x")
    return d


def test_sweep_removes_only_directories_no_live_runner_holds(tmp_path):
    """Dead (lock file unlocked): removed, without following a planted link. Live (lock held)
    and kept or foreign (no lock file): left alone."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    dead, live, kept = (_jobdir(root, n) for n in ("dead-1", "live-2", "kept-3"))
    os.close(_leftovers.hold(dead))
    (dead / "ws" / "link").symlink_to(outside)
    live_fd = _leftovers.hold(live)
    try:
        assert _leftovers.sweep(root) == 1
        assert sorted(os.listdir(root)) == ["kept-3", "live-2"]
        assert os.listdir(outside) == ["keep"]
    finally:
        _leftovers.release(live_fd, live, kept=False)
    assert _leftovers.sweep(root) == 1 and os.listdir(root) == ["kept-3"]


def test_kept_job_directory_survives_the_next_run(process, tmp_path):
    """`keep: always` leaves a directory without lock file, which later runs never remove."""
    run_jobs([job("k", keep="always")], backend=process, workdir=tmp_path)
    run_jobs([job("other")], backend=process, workdir=tmp_path)
    (kept,) = os.listdir(tmp_path)
    assert kept.startswith("k-") and not (tmp_path / kept / _leftovers.LOCK_NAME).exists()


def _runner(args, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "claw_sandbox", "run", *args, "--backend", "process"],
        env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _kill9_mid_job(tmp_path, args, env=None):
    """Start a runner on a job that sleeps, SIGKILL it once the job runs; the sleeper goes too."""
    started = tmp_path / "started"
    token = f"leftover-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = f"{sys.executable} -c 'import time; time.sleep(300)' {token}"
    command = f"test -e {started} && exit 0; touch {started}; exec {sleeper}"
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(job("slow", command)) + "\n")
    proc = _runner([str(jobs), "-o", str(tmp_path / "runs.jsonl"), *args], env)
    try:
        for _ in range(600):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    for pid in alive_with(token):
        os.kill(pid, signal.SIGKILL)
    return jobs


def test_rerun_after_kill9_removes_the_left_job_directory(tmp_path):
    """--workdir W: the killed run's job directory is gone after the rerun, which completes."""
    workdir = tmp_path / "w"
    jobs = _kill9_mid_job(tmp_path, ["--workdir", str(workdir)])
    assert len(os.listdir(workdir)) == 1
    rerun = _runner([str(jobs), "-o", str(tmp_path / "runs.jsonl"), "--workdir", str(workdir)])
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert "removed 1 job directories left by a killed run" in err.decode()
    assert os.listdir(workdir) == []


def test_rerun_after_kill9_removes_a_default_root(tmp_path):
    """Without --workdir: the next run removes the dead job directory and its temp root."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    jobs = _kill9_mid_job(tmp_path, [], env)
    (root,) = tmp.iterdir()
    assert root.name.startswith(_leftovers.ROOT_PREFIX) and len(os.listdir(root)) == 1
    rerun = _runner([str(jobs), "-o", str(tmp_path / "runs.jsonl")], env)
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert os.listdir(tmp) == []


PLANT_DEEP_TREE = """
import os
cur = os.open(".", os.O_RDONLY)
for _ in range(3000):
    os.mkdir("d", dir_fd=cur)
    sub = os.open("d", os.O_RDONLY, dir_fd=cur)
    os.close(cur)
    cur = sub
os.fchmod(cur, 0o500)
"""


@pytest.mark.parametrize("backend_name", ["process", "bwrap"])
def test_a_job_directory_thousands_of_levels_deep_is_removed(backend_name, request, tmp_path):
    """A job that plants a tree 3,000 directories deep in its workspace (deeper than Python's
    recursion limit: shutil.rmtree raised RecursionError out of the runner) finishes ok, and its
    job directory is removed; so is a dead runner's leftover of the same shape."""
    backend = request.getfixturevalue(backend_name)
    (run,) = run_jobs([job("deep", command=py(PLANT_DEEP_TREE))], backend=backend, workdir=tmp_path)
    assert run["status"] == "ok" and run["exit_code"] == 0, run
    assert os.listdir(tmp_path) == []
    dead = _jobdir(tmp_path, "dead-1")
    os.close(_leftovers.hold(dead))
    subprocess.run([sys.executable, "-c", PLANT_DEEP_TREE], cwd=dead / "ws", check=True)
    assert _leftovers.sweep(tmp_path) == 1 and os.listdir(tmp_path) == []
