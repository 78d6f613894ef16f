"""`profile: "harbor"` verify mounts on bwrap: /tests is a writable copy in the verify step's own
root, as docker copies it into the trial container (a test.sh may move or remove it)."""

from claw_sandbox import run_jobs
from sandbox_testlib import job

# the verifier moves its own tests away (as some Harbor test.sh do) and runs them from there
MOVER = "mv /tests /tmp/moved || exit 3\ntest ! -e /tests || exit 4\nsh /tmp/moved/check.sh\n"
CHECK = (
    'if [ "$(cat /app/out.txt)" = solved ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def _step(name: str) -> dict:
    return {
        "name": name, "timeout_s": 30,
        "command": "if [ -e /tests ]; then echo present; else echo absent; fi >> /logs/agent/seen",
        "verify": {"command": "bash /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                   "mounts": [{"target": "/tests", "files": {"test.sh": MOVER, "check.sh": CHECK,
                                                              "data/x.txt": "x\n"}}]},
    }  # fmt: skip


def test_verify_may_move_tests_away_on_bwrap(bwrap):
    """A verifier that runs `mv /tests /tmp/moved` succeeds on bwrap (it was a mount point:
    'Device or resource busy'); the agent never sees /tests; the reward is still read."""
    j = job(
        "mv", profile="harbor", workdir="/app", command="echo solved > /app/out.txt",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "bash /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                "mounts": [{"target": "/tests", "files": {"test.sh": MOVER, "check.sh": CHECK}}]},
        collect=["/logs/verifier/**"],
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert run["status"] == "ok" and run["verify"]["exit_code"] == 0, run
    assert run["verify"]["reward"] == 1.0
    assert run["collected"]["/logs/verifier/reward.txt"] == "1\n"


def test_each_verify_gets_a_fresh_copy_and_agents_never_see_it(bwrap):
    """Steps: each verify moves /tests away and the next verify finds it whole again; no agent
    step sees /tests (nor what a verifier left in the verify root)."""
    j = job(
        "mv-steps", profile="harbor", workdir="/app", command="true",
        mounts=[{"target": "/logs/agent"}, {"target": "/logs/verifier"}],
        steps=[{**_step("one"), "command": "echo solved > /app/out.txt; " + _step("one")["command"]},
               _step("two")],
        collect=["/logs/agent/**"],
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert [s["verify"]["reward"] for s in run["steps"]] == [1.0, 1.0], run
    assert run["collected"]["/logs/agent/seen"] == "absent\nabsent\n"


def test_root_stays_read_only_outside_verify(bwrap):
    """Only a harbor verify step with copied mounts gets a writable root; the command's root
    stays bwrap's read-only tmpfs."""
    j = job(
        "ro", profile="harbor", workdir="/app", command="touch /new-top-level-file",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "touch /verify-may-write && test -f /tests/t", "mounts": [
            {"target": "/tests", "files": {"t": ""}}]},
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert run["exit_code"] != 0 and run["verify"]["exit_code"] == 0, run


def test_rootfs_entry_at_tests_gives_way_to_the_copy():
    """bwrap --rootfs DIR whose image has its own /tests: the verify step sees the job's copy
    there (as docker replaces it), movable, and the rootfs directory is left untouched."""
    import os
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    import pytest
    from claw_sandbox.backends import make_backend

    busybox = shutil.which("busybox")
    ldd = subprocess.run(["ldd", busybox], capture_output=True, text=True) if busybox else None
    if ldd is None or "not a dynamic" not in ldd.stdout + ldd.stderr:
        pytest.skip("a static busybox is needed to make a rootfs (apt-get install busybox-static)")
    # not under pytest's tmp_path (mode 0700): bwrap runs as the job's uid for harbor jobs
    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-rootfs-tests-"))
    try:
        rootfs = top / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        (rootfs / "tests").mkdir()
        (rootfs / "tests" / "t").write_text("from the image\n")
        shutil.copy(busybox, rootfs / "bin" / "busybox")
        for tool in ("sh", "cat", "mv", "test"):
            os.symlink("busybox", rootfs / "bin" / tool)
        for d in (top, rootfs, rootfs / "bin", rootfs / "tests"):
            os.chmod(d, 0o755)
        backend = make_backend("bwrap", rootfs=str(rootfs))
        if backend.unavailable():
            pytest.skip(f"bwrap unavailable: {backend.unavailable()}")
        j = job(
            "rfv", profile="harbor", workdir="/app", command="cat /tests/t",
            mounts=[{"target": "/logs/verifier"}],
            verify={"command": "mv /tests /tmp/moved && cat /tmp/moved/t",
                    "mounts": [{"target": "/tests", "files": {"t": "from the job\n"}}]},
        )  # fmt: skip
        (run,) = run_jobs([j], backend=backend, workdir=top / "jobs")
        assert run["stdout_tail"] == "from the image\n", run  # the agent: the image's /tests
        assert run["verify"]["exit_code"] == 0 and run["verify"]["output"] == "from the job\n"
        assert (rootfs / "tests" / "t").read_text() == "from the image\n"
    finally:
        shutil.rmtree(top)


def test_image_env_is_set_where_no_image_runs(bwrap):
    """bwrap runs no image: the job's image_env (the Dockerfile's ENV) is set, under the job's
    env, and over the harbor profile's HOME=/root."""
    j = job(
        "ienv", profile="harbor", workdir="/app", command='echo "$PATH|$A|$B|$HOME"',
        image_env={"PATH": "/opt/x/bin:/usr/bin:/bin", "A": "img", "B": "img", "HOME": "/home/u"},
        env={"B": "job"},
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert run["stdout_tail"] == "/opt/x/bin:/usr/bin:/bin|img|job|/home/u\n", run


def test_a_verify_root_that_cannot_be_removed_does_not_block_the_next(bwrap, monkeypatch):
    """What one verifier leaves in its root and cannot be removed (a runner that is not root
    cannot delete a directory a verifier made mode 000) does not stop the next verify step:
    each gets a root of a fresh name."""
    import shutil
    from pathlib import Path

    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):  # a verify root's removal fails (quietly, as asked)
        if Path(path).name.startswith("verify-root"):
            if not kwargs.get("ignore_errors"):
                raise PermissionError(13, "Permission denied", str(path))
            return
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    j = job(
        "stuck", profile="harbor", workdir="/app", command="true",
        mounts=[{"target": "/logs/agent"}, {"target": "/logs/verifier"}],
        steps=[{**_step("one"), "command": "echo solved > /app/out.txt"}, _step("two")],
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert [s["verify"]["reward"] for s in run["steps"]] == [1.0, 1.0], run
