"""A job's PATH never holds a place the agent can write: the runner's relative or empty entries
(``bin``, ``''``, ``.``) and its entries inside the job's workspace, /tmp or mounts are dropped
before the job inherits the runner's PATH, so an agent's ``bin/python3`` never runs as the
verifier."""

import os
import shutil

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.backends import make_backend
from sandbox_testlib import job

# the agent's fake interpreter: writes a perfect reward and passes
FAKE_PYTHON = "#!/bin/sh\necho 1 > reward\nexit 0\n"
PLANT = (
    "mkdir -p bin && printf '%s' \"$FAKE\" > bin/python3 && chmod +x bin/python3 "
    "&& cp bin/python3 python3"
)
# the verifier: the real python3 writes 0.0 and fails
VERIFY = {
    "command": "python3 check.py",
    "files": {"check.py": "open('reward', 'w').write('0.0')\nraise SystemExit(1)\n"},
    "reward_file": "reward",
    "timeout_s": 60,
}


@pytest.mark.parametrize("name", ["bwrap", "process"])
@pytest.mark.parametrize("bad", ["bin", "", "."])
def test_relative_path_entry_does_not_run_the_agents_python(name, bad, monkeypatch, tmp_path):
    """The runner's PATH starts with a relative or empty entry (as dev/test once set it): the
    agent's bin/python3 (and ./python3) do not run as the verifier; the reward stays 0.0."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on PATH for the verifier")
    monkeypatch.setenv("PATH", f"{bad}:{os.environ['PATH']}")
    backend = make_backend(name)
    if backend.unavailable():
        pytest.skip(f"{name} backend unavailable: {backend.unavailable()}")
    row = job(f"path-{name}", command=PLANT, env={"FAKE": FAKE_PYTHON}, verify=VERIFY)
    (run,) = run_jobs([row], backend=backend, retries=0, workdir=tmp_path / "jobs")
    assert run["status"] == "ok", run
    assert run["verify"]["reward"] == 0.0 and run["verify"]["passed"] is False, run


@pytest.mark.parametrize("name", ["bwrap", "process"])
def test_job_path_keeps_only_absolute_entries_outside_the_job(name, monkeypatch, tmp_path):
    """The PATH a step sees: the runner's absolute entries in order, without `bin`, '', '.',
    '~/x', and without entries inside the job's workspace (nor /tmp itself); the job's own
    env.PATH is its author's choice and stays as given."""
    backend = make_backend(name)
    if backend.unavailable():
        pytest.skip(f"{name} backend unavailable: {backend.unavailable()}")
    extra = ["/workspace/bin", "/tmp", "/var/tmp"] if name == "bwrap" else []
    runner = ["bin", "", ".", "~/bin", *extra, "/usr/local/bin", "/usr/bin", "/bin"]
    monkeypatch.setenv("PATH", ":".join(runner))
    rows = [
        job("inherited", command="printf '%s' \"$PATH\""),
        job("own", command="printf '%s' \"$PATH\"", env={"PATH": "/opt/x:/usr/bin:/bin"}),
    ]
    runs = {
        r["job_id"]: r
        for r in run_jobs(rows, backend=backend, retries=0, workdir=tmp_path / "jobs")
    }
    assert runs["inherited"]["stdout_tail"] == "/usr/local/bin:/usr/bin:/bin", runs["inherited"]
    assert runs["own"]["stdout_tail"] == "/opt/x:/usr/bin:/bin", runs["own"]


def test_a_path_with_nothing_usable_falls_back_to_the_default(monkeypatch, tmp_path, process):
    """A runner PATH of only relative entries leaves the job the system default, not nothing."""
    from claw_sandbox.backends.base import DEFAULT_PATH

    monkeypatch.setenv("PATH", "bin::.")
    (run,) = run_jobs(
        [job("empty", command=["/bin/sh", "-c", "printf '%s' \"$PATH\""])],
        backend=process,
        retries=0,
        workdir=tmp_path / "jobs",
    )
    assert run["stdout_tail"] == DEFAULT_PATH, run


def test_path_entry_under_tmp_shows_nothing_the_job_left(bwrap, monkeypatch, tmp_path):
    """On bwrap /tmp is the job's own: a runner's PATH entry under it (missing on the host, or
    holding no program the verifier names) is an empty read-only directory in every step, so the
    agent's /tmp/.../python3 does not run as the verifier."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on PATH for the verifier")
    evil = "/tmp/claw-path-test-bin"
    monkeypatch.setenv("PATH", f"{evil}:{tmp_path}:{os.environ['PATH']}")
    plant = (
        f"mkdir -p {evil} {tmp_path} 2>/dev/null; printf '%s' \"$FAKE\" > {evil}/python3; "
        f"chmod +x {evil}/python3; cp {evil}/python3 {tmp_path}/python3; true"
    )
    row = job("tmp-path", command=plant, env={"FAKE": FAKE_PYTHON}, verify=VERIFY)
    (run,) = run_jobs([row], backend=bwrap, retries=0, workdir=tmp_path / "jobs")
    assert run["status"] == "ok", run
    assert run["verify"]["reward"] == 0.0 and run["verify"]["passed"] is False, run
