"""`profile: "harbor"` jobs: workdir as cwd, mounts at absolute places, verify mounts at verify time
only, uid 0 inside, one environment for every step (bwrap and docker)."""

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.errors import JobError
from claw_sandbox.records import Job
from sandbox_testlib import job

AGENT = (
    "echo solved > /app/out.txt; mkdir -p /root; echo changed > /root/elsewhere.txt; "
    "ls /tests > /logs/agent/tests_seen 2>/dev/null; id -u > /logs/agent/uid; pwd > /logs/agent/pwd; "
    "cat /solution/helper.txt > /logs/agent/helper; "
    "if [ -e /tests ]; then echo present; else echo absent; fi > /logs/agent/tests_exists"
)
TEST = (
    "cd /tmp || exit 1\n"
    "ls /tests >/dev/null || exit 1\n"
    'if [ "$(cat /app/out.txt)" = solved ] && [ -f /app/in.txt ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def harbor_job(job_id: str, **fields) -> dict:
    return job(
        job_id, profile="harbor", workdir="/app", command=AGENT,
        workspace={"files": {"in.txt": "input\n"}},
        mounts=[{"target": "/solution", "files": {"helper.txt": "sibling\n"}},
                {"target": "/logs/agent"}, {"target": "/logs/verifier"}],
        verify={"command": "sh /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                "mounts": [{"target": "/tests", "files": {"test.sh": TEST}}]},
        collect=["/logs/verifier/**", "/logs/agent/**", "out.txt"], **fields,
    )  # fmt: skip


def check_harbor_run(run: dict) -> None:
    assert run["status"] == "ok" and run["verify"]["reward"] == 1.0, run
    c = run["collected"]
    assert c["/logs/verifier/reward.txt"] == "1\n" and c["out.txt"] == "solved\n"
    assert c["/logs/agent/uid"] == "0\n" and c["/logs/agent/pwd"] == "/app\n"
    assert c.get("/logs/agent/tests_seen", "") == ""  # /tests holds nothing before verify
    assert c["/logs/agent/tests_exists"] == "absent\n"  # nor is it there at all (as in Harbor)
    assert c["/logs/agent/helper"] == "sibling\n"


def test_harbor_job_on_bwrap(bwrap):
    """On bwrap: cwd /app, uid 0 in its own user namespace, /solution and /logs writable, /tests
    only for verify at its absolute place (a test that cd's away still finds it)."""
    logged: list[str] = []
    j = harbor_job("hb", image_run=["RUN apt-get install -y jq"])
    runs = run_jobs(
        [j, harbor_job("hb2", image_run=["RUN true"])], backend=bwrap, log=logged.append
    )
    (run,) = [r for r in runs if r["job_id"] == "hb"]
    check_harbor_run(run)  # the default job root (above): reachable by the job's uid
    assert run["image_run_skipped"] == ["RUN apt-get install -y jq"]  # bwrap builds no image
    assert len([m for m in logged if "RUN lines" in m]) == 1  # one warning for the whole run


def test_harbor_fields_are_checked():
    """Mount targets must be absolute and not system directories; absolute collect paths must lie
    in the workdir or a mount; an unknown profile is named."""
    base = harbor_job("x")
    Job.from_dict(base)
    bad = [({"mounts": [{"target": "logs"}]}, "mounts/0/target"),
           ({"mounts": [{"target": "/etc/x"}]}, "system directory"),
           ({"mounts": [{"target": "/app/sub"}]}, "overlaps"),
           ({"collect": ["/elsewhere/**"]}, "collect/0"),
           ({"profile": "lax"}, "profile")]  # fmt: skip
    for change, msg in bad:
        with pytest.raises(JobError, match=msg):
            Job.from_dict({**base, **change})
    assert Job.from_dict(base).to_dict()["mounts"][0] == {
        "target": "/solution",
        "files": {"helper.txt": "sibling\n"},
    }


def test_process_backend_refuses_harbor_jobs(process):
    """The process backend cannot place /tests, /logs or the workdir: a harbor job is a clear job error."""
    (run,) = run_jobs([harbor_job("hp")], backend=process)
    assert run["status"] == "error" and "cannot place absolute paths" in run["error"]


def test_harbor_job_on_a_rootfs_directory():
    """bwrap --rootfs DIR: the job's root is that directory (e.g. an exported image), read-only,
    with the workdir and mounts on top; string commands use its own shell."""
    import os
    import shutil
    import subprocess
    import tempfile

    from claw_sandbox.backends import make_backend

    busybox = shutil.which("busybox")
    ldd = subprocess.run(["ldd", busybox], capture_output=True, text=True) if busybox else None
    if ldd is None or "not a dynamic" not in ldd.stdout + ldd.stderr:
        pytest.skip("a static busybox is needed to make a rootfs (apt-get install busybox-static)")
    rootfs = tempfile.mkdtemp(prefix="claw-sandbox-test-rootfs-")
    try:
        os.chmod(
            rootfs, 0o755
        )  # the job's uid must reach it (bwrap runs as that uid for harbor jobs)
        os.mkdir(f"{rootfs}/bin")
        shutil.copy(busybox, f"{rootfs}/bin/busybox")
        for tool in ("sh", "cat", "id", "pwd", "touch"):
            os.symlink("busybox", f"{rootfs}/bin/{tool}")
        with open(f"{rootfs}/marker", "w") as f:
            f.write("from the rootfs\n")
        backend = make_backend("bwrap", rootfs=rootfs)
        if backend.unavailable():
            pytest.skip(f"bwrap unavailable: {backend.unavailable()}")
        j = job("rf", profile="harbor", workdir="/app", command="cat /marker; id -u; pwd; touch /marker2",
                mounts=[{"target": "/logs/verifier"}])  # fmt: skip
        (run,) = run_jobs([j], backend=backend)
        assert run["status"] == "ok", run
        assert run["stdout_tail"] == "from the rootfs\n0\n/app\n"
        assert run["exit_code"] != 0  # the root stays read-only
    finally:
        shutil.rmtree(rootfs)
