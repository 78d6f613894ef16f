"""Harbor trials on docker: errors say what failed (a trial container that is not running names
its exit code, the PATH its command was looked up in and its last log lines, not a follow-on
symptom); a verifier may move /tests away; the image's own PATH is kept."""

import os

import pytest
from claw_sandbox import run_jobs
from sandbox_testlib import job
from test_docker import IMAGE, docker_backend  # noqa: F401  (the module's engine fixture)

pytestmark = pytest.mark.slow
BROKEN_PATH = "/opt/x/bin:${PATH}"  # a Dockerfile's ENV PATH copied without expansion


def _harbor(job_id: str, **fields) -> dict:
    return job(
        job_id, image=IMAGE, profile="harbor", workdir="/app", command="echo never",
        env={"PATH": BROKEN_PATH}, mounts=[{"target": "/logs/verifier"}], **fields,
    )  # fmt: skip


def _check_exit_reason(error: str) -> None:
    assert "is not running" in error and "exit code 127" in error, error
    assert f"PATH={BROKEN_PATH!r}" in error, error
    assert "its last log lines:" in error and "sleep" in error, error  # docker-init's own line


def test_trial_container_that_exits_at_start_is_named(docker_backend, tmp_path):  # noqa: F811
    """A harbor job whose env breaks PATH: its trial container's `sleep infinity` is not found
    and the container exits 127 at once; the run's error says so (it said 'docker exec failed:
    ... is not running' at the first step)."""
    (run,) = run_jobs([_harbor("deadpath")], backend=docker_backend, workdir=tmp_path)
    assert run["status"] == "infra_error", run
    _check_exit_reason(run["error"])


def test_proxy_network_on_an_exited_container_is_named(docker_backend, tmp_path):  # noqa: F811
    """With network policy proxy the same container used to read 'network proxy on docker needs
    root and nsenter'; now the error is the container's exit."""
    if os.geteuid() != 0:
        pytest.skip("the docker proxy forwarder needs root (nsenter)")
    net = {"policy": "proxy", "proxy_url": "http://127.0.0.1:9", "port": 18080}
    (run,) = run_jobs([_harbor("deadnet", network=net)], backend=docker_backend, workdir=tmp_path)
    assert run["status"] == "infra_error", run
    assert "nsenter" not in run["error"], run["error"]
    _check_exit_reason(run["error"])


def test_verifier_that_moves_tests_away_leaves_no_error(docker_backend, tmp_path):  # noqa: F811
    """A verifier may `mv /tests ...` on docker too; nothing reads /tests back, so the run has
    no 'could not copy the mount /tests out' error (it had one)."""
    from test_harbor_mounts import CHECK, MOVER

    j = job(
        "mvd", image=IMAGE, profile="harbor", workdir="/app", command="echo solved > /app/out.txt",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "sh /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                "mounts": [{"target": "/tests", "files": {"test.sh": MOVER, "check.sh": CHECK}}]},
    )  # fmt: skip
    (run,) = run_jobs([j], backend=docker_backend, workdir=tmp_path)
    assert run["status"] == "ok" and run["verify"]["reward"] == 1.0, run
    assert run.get("error") is None, run["error"]


def test_harbor_steps_keep_the_images_own_path(docker_backend, tmp_path):  # noqa: F811
    """A harbor trial runs with its image's PATH (a base image's /opt/conda/bin, say), not
    docker's default PATH put over it, nor the job's image_env; a job env PATH still wins."""
    import subprocess

    tag = "claw-sandbox-test:own-path"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {IMAGE}\nENV PATH=/opt/own/bin:/bin\n")
    p = subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"docker build failed: {p.stderr.decode(errors='replace')[-200:]}")
    try:
        jobs = [
            job("own", image=tag, profile="harbor", workdir="/app", command="echo $PATH"),
            job("set", image=tag, profile="harbor", workdir="/app", command="echo $PATH",
                env={"PATH": "/bin:/x"}),
            job("img", image=tag, profile="harbor", workdir="/app", command="echo $PATH $A",
                image_env={"PATH": "/guessed:/bin", "A": "from-the-dockerfile"}),
        ]  # fmt: skip
        runs = {r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, workdir=tmp_path)}
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    assert runs["own"]["stdout_tail"] == "/opt/own/bin:/bin\n", runs["own"]
    assert runs["set"]["stdout_tail"] == "/bin:/x\n", runs["set"]
    # image_env is for backends that run no image: docker has the image's own (no A here)
    assert runs["img"]["stdout_tail"] == "/opt/own/bin:/bin\n", runs["img"]
