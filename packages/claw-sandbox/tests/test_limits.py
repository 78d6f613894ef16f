"""Limits hold without harming the runner or the jobs running next to the offender."""

import os
import subprocess

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.records import Job
from sandbox_testlib import job, py

FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 5"
MEMORY_HOG = py("x = bytearray(512 << 20); print('allocated', len(x))")


@pytest.fixture(params=["bwrap", "process"])
def backend(request, cgroups):
    return request.getfixturevalue(request.param)


def test_fork_bomb_is_stopped_by_the_pids_limit(backend, tmp_path):
    """A fork bomb hits pids.max, is killed at the timeout, and a neighbour job finishes fine."""
    runs = run_jobs(
        [job("bomb", command=FORK_BOMB, limits={"pids": 32}, timeout_s=3),
         job("neighbour", command="sleep 1; echo fine", limits={"pids": 32})],
        backend=backend, parallel=2, workdir=tmp_path / "w",
    )  # fmt: skip
    by_id = {r["job_id"]: r for r in runs}
    # killed at the timeout, or ended early because even its `sleep` could not fork
    assert by_id["bomb"]["status"] in ("timeout", "ok")
    assert "pids limit reached (32)" in by_id["bomb"]["error"]
    assert by_id["neighbour"]["status"] == "ok" and by_id["neighbour"]["stdout_tail"] == "fine\n"
    assert os.listdir(tmp_path / "w") == []  # the bomb's sandbox was still torn down


def test_memory_hog_is_stopped_by_the_memory_limit(backend, tmp_path):
    """Allocating past memory_mb kills the job (exit 137) and says why; the runner lives on."""
    runs = run_jobs(
        [job("hog", command=MEMORY_HOG, limits={"memory_mb": 64}),
         job("neighbour", command=py("print(sum(range(10**6)))"), limits={"memory_mb": 64})],
        backend=backend, parallel=2, workdir=tmp_path / "w",
    )  # fmt: skip
    by_id = {r["job_id"]: r for r in runs}
    hog = by_id["hog"]
    assert hog["status"] == "ok" and hog["exit_code"] == 137, hog
    assert "allocated" not in hog["stdout_tail"]
    assert "memory limit exceeded (64 MB)" in hog["error"]
    assert by_id["neighbour"]["stdout_tail"] == "499999500000\n"


def test_cpu_limit_throttles(backend, tmp_path):
    """cpus: 0.2 lets a busy loop use at most about a fifth of one core."""
    code = "import time\nt=time.time(); c=time.process_time()\nwhile time.time()-t < 1.5: pass\nprint(round((time.process_time()-c)/1.5, 2))"
    (run,) = run_jobs(
        [job("cpu", command=py(code), limits={"cpus": 0.2})], backend=backend, workdir=tmp_path
    )
    share = float(run["stdout_tail"])
    assert share < 0.45, share


def test_memory_rlimit_fallback_without_cgroups(tmp_path):
    """Without a writable cgroup tree the memory limit still holds, as an address-space rlimit."""
    from claw_sandbox import _cgroup
    from claw_sandbox.backends.process import ProcessBackend

    backend = ProcessBackend()
    backend.cgroups = _cgroup.CgroupSupport(None, reason="disabled for this test")
    (run,) = run_jobs(
        [job("hog", command=MEMORY_HOG, limits={"memory_mb": 128})],
        backend=backend,
        workdir=tmp_path,
    )
    assert run["exit_code"] != 0 and "allocated" not in run["stdout_tail"]
    assert "MemoryError" in run["stderr_tail"]


def test_groups_of_a_dead_runner_are_swept(cgroups):
    """Job cgroups left by a runner killed with SIGKILL are removed the next time one starts."""
    from claw_sandbox import _cgroup
    from claw_sandbox.records import Limits

    proc = subprocess.Popen(["true"])
    proc.wait()  # a pid that is surely dead now
    group = _cgroup.JobCgroup.create(cgroups, Limits(pids=8), "sweeptest")
    stale = [d.with_name(d.name.replace(f"-{os.getpid()}-", f"-{proc.pid}-")) for d in group.dirs]
    for d, s in zip(group.dirs, stale, strict=True):
        d.rename(s)
    assert all(s.exists() for s in stale)
    assert _cgroup.sweep_stale(cgroups) >= len(stale)
    assert not any(s.exists() for s in stale)


@pytest.mark.parametrize("name", ["bwrap", "process"])
def test_a_job_without_limits_gets_the_backend_defaults(name, cgroups, tmp_path):
    """No `limits` in the job: the backend's default memory bound still stops a hog."""
    from claw_sandbox.backends import make_backend
    from claw_sandbox.records import Limits

    backend = make_backend(name, default_limits=Limits(memory_mb=64, pids=64))
    if backend.unavailable():
        pytest.skip(f"{name} backend unavailable: {backend.unavailable()}")
    (run,) = run_jobs([job("hog", command=MEMORY_HOG)], backend=backend, workdir=tmp_path)
    assert run["exit_code"] == 137 and "allocated" not in run["stdout_tail"], run
    assert "memory limit exceeded (64 MB)" in run["error"]


def test_documented_defaults_fill_only_what_a_job_leaves_out():
    """Defaults fill absent limits; a job's own value always wins."""
    from claw_sandbox.backends.base import DEFAULT_LIMITS, effective_limits
    from claw_sandbox.records import Limits

    got = effective_limits(Limits(memory_mb=100), DEFAULT_LIMITS, cgroup=True, disk=True)
    assert got.memory_mb == 100 and got.pids == DEFAULT_LIMITS.pids
    assert got.cpus == DEFAULT_LIMITS.cpus and got.disk_mb == DEFAULT_LIMITS.disk_mb
    assert effective_limits(Limits(), Limits(), cgroup=True, disk=True) == Limits()
    # what a sandbox cannot enforce is not claimed: no cgroup, no defaults; no mount, no disk
    bare = effective_limits(Limits(disk_mb=10, pids=5), DEFAULT_LIMITS, cgroup=False, disk=False)
    assert bare == Limits(pids=5)


def test_job_cgroups_sit_below_the_runners_own(cgroups):
    """Each job group is created inside the cgroup the runner itself is in (per v1 controller)."""
    from claw_sandbox import _cgroup
    from claw_sandbox.records import Limits

    own = _cgroup.own_cgroups()
    group = _cgroup.JobCgroup.create(cgroups, Limits(pids=8), "undertest")
    try:
        for d in group.dirs:
            rel = d.relative_to(_cgroup.ROOT)
            ctl = rel.parts[0] if cgroups.version == 1 else ""
            mine = own[ctl].strip("/").removesuffix(_cgroup.RUNNER_LEAF).rstrip("/")
            inside = "/".join(rel.parts[1:] if cgroups.version == 1 else rel.parts)
            assert inside.startswith(f"{mine}/" if mine else ""), (d, own)
            assert inside.endswith(f"claw-sandbox/{d.name}")
    finally:
        group.destroy()
    assert not any(d.exists() for d in group.dirs)


def test_own_cgroups_parses_v1_and_v2_lines():
    """/proc/self/cgroup lines map each v1 controller (and the v2 tree) to a path."""
    from claw_sandbox import _cgroup

    text = "4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/user.slice/x.scope\n"
    own = _cgroup.own_cgroups(text)
    assert own["memory"] == "/a/b" and own["cpu"] == "/c" and own["cpuacct"] == "/c"
    assert own[""] == "/user.slice/x.scope"


def test_disk_limit_is_a_sized_tmpfs_and_is_recorded(bwrap, tmp_path):
    """disk_mb: writing past it fails with ENOSPC (bwrap as root); the run records its bounds."""
    if not bwrap.sandbox(Job.from_dict(job()), tmp_path / "x").limits.disk_mb:
        pytest.skip("disk limits need a root runner (tmpfs job directories)")
    code = (
        "import errno\n"
        "try:\n    open('big', 'wb').write(b'0' * (20 << 20)); print('WROTE')\n"
        "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
    (run,) = run_jobs(
        [job("disk", command=py(code), limits={"disk_mb": 8})], backend=bwrap, workdir=tmp_path
    )
    assert run["stdout_tail"] == "ENOSPC\n", run["error"]
    assert run["limits"]["disk_mb"] == 8
    assert os.listdir(tmp_path) == []  # unmounted and removed
    (plain,) = run_jobs([job("plain")], backend=bwrap, workdir=tmp_path)
    assert plain["limits"]["disk_mb"] == bwrap.default_limits.disk_mb


def test_a_dead_runners_tmpfs_job_directory_is_unmounted_and_removed(tmp_path):
    """A SIGKILLed runner leaves a mounted tmpfs job directory; the next sweep removes it."""
    from claw_sandbox import _leftovers, _tmpfs

    if not _tmpfs.can_mount():
        pytest.skip("mounting a tmpfs needs root")
    dead = tmp_path / "root" / "dead-1"
    dead.mkdir(parents=True)
    _tmpfs.mount(dead, 4)
    try:
        (dead / "ws").mkdir()
        (dead / "ws" / "f").write_text("x")
        os.close(_leftovers.hold(dead))  # its runner is gone: nobody holds the lock
        assert os.path.ismount(dead)
        assert _leftovers.sweep(tmp_path / "root") == 1
        assert not dead.exists()
    finally:
        if dead.exists():
            _tmpfs.unmount(dead)
