"""The docker backend against a real engine, with a busybox image made by `docker import`."""

import gc
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import warnings

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.backends import make_backend
from sandbox_testlib import job

pytestmark = pytest.mark.slow
IMAGE = "claw-sandbox-test:busybox"
TOOLS = [
    "sh",
    "echo",
    "cat",
    "sleep",
    "dd",
    "ls",
    "id",
    "touch",
    "test",
    "grep",
    "wget",
    "nc",
    "mkdir",
    "env",
    "true",
    "false",
    "rm",
    "head",
    "printf",
]


def _busybox_rootfs() -> bytes:
    """A tar of a root filesystem: static busybox and its applet links, nothing else."""
    busybox = shutil.which("busybox")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, "bin/busybox")
        for tool in TOOLS:
            info = tarfile.TarInfo(f"bin/{tool}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        for d in ("tmp", "workspace", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return buf.getvalue()


def _static_busybox() -> bool:
    path = shutil.which("busybox")
    if not path:
        return False
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True)
    return ldd.returncode != 0 or "not a dynamic executable" in ldd.stdout + ldd.stderr


@pytest.fixture(scope="module")
def docker_backend():
    backend = make_backend("docker")
    reason = backend.unavailable()
    if reason:
        pytest.skip(f"docker backend unavailable: {reason}")
    client = backend.client()
    import docker.errors

    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        if not _static_busybox():
            pytest.skip(
                "no static busybox to build the test image from (apt-get install busybox-static)"
            )
        repo, tag = IMAGE.split(":")
        client.api.import_image_from_data(_busybox_rootfs(), repository=repo, tag=tag)
        client.images.get(IMAGE)
    return backend


@pytest.mark.parametrize("host", ["unix", "tcp"])
def test_no_engine_is_a_reason_and_leaks_no_socket(monkeypatch, tmp_path, host):
    """Without an engine (a missing unix socket, a closed TCP port) `unavailable` gives a reason
    and the failed connection leaves no unclosed socket behind (a ResourceWarning later)."""
    pytest.importorskip("docker")
    url = (
        f"unix://{tmp_path / 'none.sock'}" if host == "unix" else f"tcp://127.0.0.1:{_free_port()}"
    )
    monkeypatch.setenv("DOCKER_HOST", url)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        reason = make_backend("docker").unavailable()
        gc.collect()
    assert reason and reason.startswith("no docker engine answers"), reason
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []


def test_docker_lifecycle_isolation_and_bad_image(docker_backend, tmp_path):
    """Workspace, verify and collect work; the root is read-only; a missing image is a job error."""
    jobs = [
        job("ok", image=IMAGE, workspace={"files": {"in.txt": "hi\n"}},
            command="cat in.txt > out.txt; id -u; touch /etc/x 2>/dev/null || echo ro-root",
            verify={"command": "test -f .v/ok && grep -q hi out.txt", "files": {".v/ok": ""}},
            collect=["out.txt"]),
        job("noimage", image="claw-sandbox-test:does-not-exist"),
        job("slow", image=IMAGE, command="sleep 30", timeout_s=1),
    ]  # fmt: skip
    runs = {
        r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, parallel=3, workdir=tmp_path)
    }
    ok = runs["ok"]
    assert ok["status"] == "ok" and ok["verify"]["passed"], ok
    assert ok["collected"] == {"out.txt": "hi\n"} and "ro-root" in ok["stdout_tail"]
    if os.geteuid() == 0:
        assert ok["stdout_tail"].splitlines()[0] == "65534"
    assert runs["noimage"]["status"] == "error" and "not found" in runs["noimage"]["error"]
    assert runs["slow"]["status"] == "timeout"


def test_docker_limits(docker_backend, tmp_path):
    """The memory limit kills a hog (and says so); a fork bomb is contained by pids_limit."""
    jobs = [
        job("hog", image=IMAGE, command=["dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"],
            limits={"memory_mb": 64}),
        job("bomb", image=IMAGE, command="b() { b | b & }; b; sleep 3", limits={"pids": 32}, timeout_s=2),
        job("neighbour", image=IMAGE, command="echo fine"),
    ]  # fmt: skip
    runs = {
        r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, parallel=3, workdir=tmp_path)
    }
    assert runs["hog"]["exit_code"] == 137 and "memory limit exceeded" in runs["hog"]["error"]
    bomb = runs["bomb"]  # killed at the timeout, or ended early because `sleep` could not fork
    assert bomb["status"] == "timeout" or "fork" in bomb["stderr_tail"], bomb
    assert runs["neighbour"]["stdout_tail"] == "fine\n"


def test_docker_defaults_bound_a_job_without_limits(docker_backend, tmp_path):
    """No `limits`: the container still gets the default pids/memory bounds, recorded in the run,
    and runs under a seccomp filter (the engine's default profile)."""
    cmd = (
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; "
        "grep Seccomp: /proc/self/status"
    )
    (run,) = run_jobs([job("d", image=IMAGE, command=cmd)], backend=docker_backend,
                      workdir=tmp_path)  # fmt: skip
    defaults = docker_backend.default_limits
    assert run["limits"]["pids"] == defaults.pids and run["limits"]["memory_mb"] > 0, run
    lines = run["stdout_tail"].split()
    assert lines[0] == str(defaults.pids), run
    assert lines[1:] == ["Seccomp:", "2"], run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_docker_network_proxy_only(docker_backend, tmp_path):
    """Policy proxy: the proxy answers on 127.0.0.1:PORT inside; the host's ports do not."""
    if os.geteuid() != 0:
        pytest.skip("the docker proxy forwarder needs root (nsenter)")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from the proxy\n" * 50)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)
        cmd = (f"wget -q -O- http://127.0.0.1:18080/ | head -n 1; "
               f"wget -q -O- http://127.0.0.1:{port}/ 2>/dev/null || echo blocked")  # fmt: skip
        net = {"policy": "proxy", "proxy_url": f"http://127.0.0.1:{port}", "port": 18080}
        (run,) = run_jobs(
            [job("net", image=IMAGE, command=cmd, network=net)],
            backend=docker_backend,
            workdir=tmp_path / ("d" * 60) / ("e" * 60),
        )  # deeper than AF_UNIX allows
    finally:
        server.kill()
        server.wait()
    assert run["stdout_tail"].splitlines()[:2] == ["hello from the proxy", "blocked"], run


def test_harbor_job_on_docker(docker_backend, tmp_path):
    """profile harbor on docker: one container for every step (the agent's change outside the
    workdir is there at verify time), root inside, cwd /app, /tests only at verify time."""
    from test_harbor_profile import check_harbor_run, harbor_job

    j = harbor_job("hbd", image=IMAGE)
    j["verify"]["command"] = "test -f /root/elsewhere.txt && sh /tests/test.sh"
    slow = harbor_job("hbslow", image=IMAGE, timeout_s=5)  # docker exec's start fits in it
    slow["command"] = "echo started > /logs/agent/started; sleep 60"
    runs = {r["job_id"]: r for r in run_jobs([j, slow], backend=docker_backend, workdir=tmp_path)}
    check_harbor_run(runs["hbd"])
    # a step past its timeout is killed in the container, which lives on for the verify step
    assert (
        runs["hbslow"]["status"] == "timeout" and runs["hbslow"]["verify"]["exit_code"] is not None
    )
    assert runs["hbslow"]["collected"]["/logs/agent/started"] == "started\n"


def test_steps_on_docker(docker_backend, tmp_path):
    """Steps on docker: one trial container for all of them, /tests copied in for each verify
    only, step files copied into the workdir, a reward under min_reward ends the steps."""
    from test_steps import check_gated_run, check_steps_run, steps_job

    jobs = [steps_job("s3d", image=IMAGE), steps_job("gatedd", image=IMAGE, second_line="no\n")]
    runs = {r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, workdir=tmp_path)}
    check_steps_run(runs["s3d"])
    check_gated_run(runs["gatedd"])


#: a sidecar that serves "blue" over HTTP on port 8080, ready (its healthcheck passes) only after
#: a second: a job started before it is ready finds nothing there
SERVE = (
    "sleep 1; touch /tmp/ready; "
    "while true; do printf 'HTTP/1.0 200 OK\\r\\n\\r\\nblue\\n' | nc -l -p 8080; done"
)
WEB = {"name": "web", "image": IMAGE, "command": SERVE, "env": {"COLOR": "blue"},
       "healthcheck": {"command": "test -e /tmp/ready", "interval_s": 0.2, "retries": 100}}  # fmt: skip


def _job_leftovers(client, job_id: str) -> list[str]:
    label = {"label": f"claw-sandbox.job={job_id}"}
    return [c.name for c in client.containers.list(all=True, filters=label)] + [
        n.name for n in client.networks.list(filters=label)
    ]


def test_services_on_docker(docker_backend, tmp_path):
    """A job with a service reaches it by name once it is healthy (claw and harbor profiles); the
    service and the job's network are gone after the job; a service whose healthcheck never
    passes is an infra error naming it; policy host is refused."""
    get = "wget -q -O- http://web:8080/ > /logs/verifier/got; cat /logs/verifier/got"
    hb = job(
        "svc-hb", image=IMAGE, profile="harbor", workdir="/app", command=get, services=[WEB],
        mounts=[{"target": "/logs/verifier"}], collect=["/logs/verifier/got"],
    )  # fmt: skip
    sick = {
        **WEB,
        "name": "db",
        "healthcheck": {"command": "false", "interval_s": 0.2, "retries": 2},
    }
    jobs = [
        job("svc", image=IMAGE, command="wget -q -O- http://web:8080/", services=[WEB]),
        hb,
        job("svc-sick", image=IMAGE, command="echo never", services=[sick]),
        job("svc-host", image=IMAGE, command="true", services=[WEB], network={"policy": "host"}),
    ]
    runs = {r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, workdir=tmp_path)}
    assert runs["svc"]["status"] == "ok" and runs["svc"]["stdout_tail"] == "blue\n", runs["svc"]
    assert runs[hb["job_id"]]["collected"]["/logs/verifier/got"] == "blue\n", runs[hb["job_id"]]
    assert runs["svc-sick"]["status"] == "infra_error", runs["svc-sick"]
    assert "service db is unhealthy" in runs["svc-sick"]["error"]
    assert "never" not in runs["svc-sick"]["stdout_tail"]
    assert runs["svc-host"]["status"] == "error" and "policy host" in runs["svc-host"]["error"]
    client = docker_backend.client()
    for j in jobs:
        assert _job_leftovers(client, j["job_id"]) == [], j["job_id"]


def test_services_without_the_sidecar_fail(docker_backend, tmp_path):
    """The same job without its service cannot reach `web` (the sidecar is what it checks)."""
    (run,) = run_jobs(
        [job("nosvc", image=IMAGE, command="wget -q -O- http://web:8080/ || echo unreachable")],
        backend=docker_backend, workdir=tmp_path,
    )  # fmt: skip
    assert run["stdout_tail"] == "unreachable\n", run


def test_sweep_removes_what_a_killed_runner_left(docker_backend):
    """A service container and network labelled with a runner pid that no longer runs are removed
    by the sweep; a live runner's are kept."""
    from claw_sandbox.backends._docker_services import RUNNER_LABEL, runner_id, sweep_services

    client = docker_backend.client()
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = runner_id().rpartition(":")[0]
    made = []
    for who in (f"{host}:{dead.pid}", runner_id()):
        labels = {RUNNER_LABEL: who, "claw-sandbox.job": "sweep-test"}
        net = client.networks.create(f"claw-sweep-{len(made)}-{os.getpid()}", labels=labels,
                                     internal=True)  # fmt: skip
        c = client.containers.create(IMAGE, ["sleep", "30"], labels=labels, network=net.name)
        made.append((net, c))
    try:
        assert sweep_services(client) >= 2
        left = _job_leftovers(client, "sweep-test")
        assert sorted(left) == sorted([made[1][0].name, made[1][1].name]), left
    finally:
        made[1][1].remove(force=True)
        made[1][0].remove()
