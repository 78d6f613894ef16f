"""What the sandboxes keep out: host writes, the host's home, other jobs, the network."""

import http.server
import os
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from claw_sandbox import run_jobs
from sandbox_testlib import job, py


def _one(bwrap, row, tmp_path):
    (run,) = run_jobs([row], backend=bwrap, workdir=tmp_path / "w")
    return run


def test_writing_outside_the_workspace_fails(bwrap, tmp_path):
    """The host root is read-only; /tmp is the job's own; the host's /tmp is untouched."""
    target = tmp_path / f"outside-{uuid.uuid4().hex}"
    code = (
        "import os\n"
        f"for p in ['/usr/claw-x', '/etc/claw-x', {str(target)!r}, '/claw-x']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('denied', p, e.errno)\n"
        "open('/workspace/ok', 'w').write('y'); open('/tmp/ok', 'w').write('z'); print('inside ok')\n"
    )
    run = _one(bwrap, job("w", command=py(code)), tmp_path)
    assert run["exit_code"] == 0, run
    assert "WROTE" not in run["stdout_tail"] and "inside ok" in run["stdout_tail"]
    assert not target.exists()


def test_host_home_and_secrets_are_not_readable(bwrap, tmp_path):
    """The host's home is an empty directory inside; root-only files are unreadable (other uid)."""
    if not (Path.home().is_dir() and os.access(Path.home(), os.W_OK)):
        pytest.skip(f"the host home {Path.home()} is not a writable directory: no marker to plant")
    marker = Path.home() / f".claw-sandbox-test-{uuid.uuid4().hex}"
    marker.write_text("host home secret")
    try:
        cmd = f"cat {marker} 2>&1; ls -A {Path.home()} | wc -l; id -u; cat /etc/shadow >/dev/null 2>&1 && echo SHADOW"
        run = _one(bwrap, job("h", command=cmd), tmp_path)
    finally:
        marker.unlink()
    assert "host home secret" not in run["stdout_tail"]
    out = run["stdout_tail"].splitlines()
    assert "No such file" in out[0]
    if os.geteuid() == 0:
        assert out[2] != "0" and "SHADOW" not in run["stdout_tail"]


def test_host_sockets_are_out_of_reach(bwrap, tmp_path):
    """The docker socket and the rest of /run are not inside the sandbox."""
    run = _one(
        bwrap,
        job("s", command="ls -A /run /var/run; test -e /var/run/docker.sock && echo REACHABLE"),
        tmp_path,
    )
    assert "REACHABLE" not in run["stdout_tail"]
    assert "docker.sock" not in run["stdout_tail"]


def test_other_jobs_workspaces_are_invisible(bwrap, tmp_path):
    """A job cannot find another running job's files, neither in /tmp nor under the work dir."""
    secret = f"secret-{uuid.uuid4().hex}"
    workdir = tmp_path / "w"
    writer = job("writer", command=f"echo {secret} > s.txt; echo {secret} > /tmp/s.txt; sleep 2")
    reader = job(
        "reader",
        command=f"sleep 0.5; grep -rs {secret} /tmp {workdir} /workspace; ls -A {workdir} 2>&1; true",
    )
    runs = {
        r["job_id"]: r
        for r in run_jobs([writer, reader], backend=bwrap, parallel=2, workdir=workdir)
    }
    assert runs["reader"]["status"] == "ok"
    assert secret not in runs["reader"]["stdout_tail"]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {self.server.server_port}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    """Two HTTP servers on the host's loopback: the proxy and something else."""
    made = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in made]
    for t in threads:
        t.start()
    yield [s.server_port for s in made]
    for s in made:
        s.shutdown()
        s.server_close()


PROBE = """
import sys, urllib.request
for url in sys.argv[1:]:
    try:
        print(url, 'OK', urllib.request.urlopen(url, timeout=2).read().decode())
    except Exception as e:
        print(url, 'FAIL', type(e).__name__)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_network_proxy_reaches_only_the_proxy(bwrap, tmp_path, servers):
    """With policy proxy the proxy answers on 127.0.0.1:PORT; other ports and outside do not."""
    proxy_port, other_port = servers
    inner = _free_port()
    urls = [f"http://127.0.0.1:{inner}/", f"http://127.0.0.1:{other_port}/",
            f"http://127.0.0.1:{proxy_port}/", "http://10.0.0.1/", "http://1.1.1.1/"]  # fmt: skip
    network = {"policy": "proxy", "proxy_url": f"http://127.0.0.1:{proxy_port}", "port": inner}
    # a work directory deeper than an AF_UNIX path may be long (107 bytes): the socket still binds
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    run = _one(bwrap, job("net", command=py(PROBE) + urls, network=network, env={"X": "1"}), deep)
    lines = dict(line.split(" ", 1) for line in run["stdout_tail"].splitlines())
    assert lines[urls[0]] == f"OK hello from {proxy_port}", run
    for url in urls[1:]:
        assert lines[url].startswith("FAIL"), (url, lines[url])


def test_network_none_and_host(bwrap, tmp_path, servers):
    """Policy none reaches nothing, not even the host's loopback; policy host reaches it."""
    url = f"http://127.0.0.1:{servers[0]}/"
    none = _one(bwrap, job("n", command=py(PROBE) + [url]), tmp_path)
    assert "FAIL" in none["stdout_tail"]
    host = _one(bwrap, job("h", command=py(PROBE) + [url], network={"policy": "host"}), tmp_path)
    assert f"OK hello from {servers[0]}" in host["stdout_tail"]


def test_verify_network_host_reaches_only_at_verify_time(bwrap, tmp_path, servers):
    """verify.network host: the verify step reaches the host's loopback, the command (network
    none) and a verify step without it do not."""
    url = f"http://127.0.0.1:{servers[0]}/"
    probe = shlex.join([sys.executable, "-c", PROBE, url])
    verify = {"command": f"{probe} > /workspace/verify.txt", "network": {"policy": "host"}}
    row = job("vn", command=py(PROBE) + [url], verify=verify, collect=["verify.txt"])
    run = _one(bwrap, row, tmp_path)
    assert "FAIL" in run["stdout_tail"], run
    assert f"OK hello from {servers[0]}" in run["collected"]["verify.txt"], run
    plain = job("vp", command="true", verify={"command": verify["command"]}, collect=["verify.txt"])
    assert "FAIL" in _one(bwrap, plain, tmp_path)["collected"]["verify.txt"]


def test_process_backend_relays_the_proxy_port_without_blocking(process, tmp_path, servers):
    """The process backend cannot isolate: the proxy is relayed to PORT, the rest stays reachable."""
    proxy_port, other_port = servers
    inner = _free_port()
    urls = [f"http://127.0.0.1:{inner}/", f"http://127.0.0.1:{other_port}/"]
    network = {"policy": "proxy", "proxy_url": f"http://127.0.0.1:{proxy_port}", "port": inner}
    jobs = [job(f"p{i}", command=py(PROBE) + urls, network=network) for i in range(2)]
    runs = run_jobs(jobs, backend=process, parallel=2, workdir=tmp_path)
    for run in runs:
        assert f"{urls[0]} OK hello from {proxy_port}" in run["stdout_tail"], run
        assert f"{urls[1]} OK hello from {other_port}" in run["stdout_tail"]
    with socket.socket() as s:  # the shared relay is gone with the last job
        assert s.connect_ex(("127.0.0.1", inner)) != 0


def test_hidden_venv_with_editable_source_is_bound_back(bwrap, tmp_path):
    """A venv under a hidden directory (here /tmp) runs inside, editable sources included."""
    with tempfile.TemporaryDirectory(dir="/tmp") as hidden:  # tmp_path may lie elsewhere
        _hidden_venv_runs(bwrap, Path(hidden), tmp_path)


def _hidden_venv_runs(bwrap, base: Path, tmp_path: Path) -> None:
    venv = base / "venv"
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (venv / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(os.path.realpath(sys.executable))}\n"
    )
    src = base / "project" / "src"
    src.mkdir(parents=True)
    (src / "claw_probe_mod.py").write_text("X = 'editable source visible'\n")
    (site / "_claw_probe.pth").write_text(f"{src}\n")
    cmd = [str(venv / "bin" / "python"), "-c", "import claw_probe_mod; print(claw_probe_mod.X)"]
    run = _one(bwrap, job("v", command=cmd), tmp_path)
    assert run["stdout_tail"] == "editable source visible\n", run["stderr_tail"]


def _stray_dir() -> Path:
    """A fresh directory outside the usual hidden ones (/var/tmp, /srv or /opt), or skip."""
    for base in ("/var/tmp", "/srv", "/opt"):
        if os.path.isdir(base) and os.access(base, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="claw-stray-", dir=base))
    pytest.skip("no writable /var/tmp, /srv or /opt to plant a stray secret in")


def test_stray_host_secret_and_socket_are_out_of_reach(bwrap, tmp_path):
    """A 0644 secret and a 0666 unix socket in a host directory outside the defaults: unreachable."""
    stray = _stray_dir()
    try:
        os.chmod(stray, 0o755)
        secret = stray / "proxy-secret"
        secret.write_text("stray-secret-value")
        os.chmod(secret, 0o644)
        sock_path = stray / "api.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(sock_path))
        os.chmod(sock_path, 0o666)
        server.listen(4)
        code = (
            "import socket, sys\n"
            "try:\n    print('READ', open(sys.argv[1]).read())\n"
            "except OSError as e:\n    print('no read', e.errno)\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[2]); print('CONNECTED')\n"
            "except OSError as e:\n    print('no connect', e.errno)\n"
        )
        for policy in ("none", "host"):
            argv = [*py(code), str(secret), str(sock_path)]
            run = _one(bwrap, job("stray", command=argv, network={"policy": policy}), tmp_path)
            assert run["exit_code"] == 0, run
            assert "no read" in run["stdout_tail"] and "no connect" in run["stdout_tail"], run
            assert "stray-secret-value" not in run["stdout_tail"]
        server.close()
        # an abstract unix socket lives in the network namespace: none means a fresh one
        abstract = socket.socket(socket.AF_UNIX)
        name = f"claw-stray-{uuid.uuid4().hex}"
        abstract.bind("\0" + name)
        abstract.listen(4)
        try:
            probe = (
                f"import socket; socket.socket(socket.AF_UNIX).connect('\\0{name}'); print('IN')"
            )
            run = _one(bwrap, job("abstract", command=py(probe)), tmp_path)
            assert "IN" not in run["stdout_tail"] and "ConnectionRefused" in run["stderr_tail"], run
        finally:
            abstract.close()
    finally:
        shutil.rmtree(stray, ignore_errors=True)


def test_only_system_directories_are_visible(bwrap, tmp_path):
    """The root holds the allow-list (system dirs, workspace, /tmp, empty /root ...), not /srv or /opt."""
    code = "import os; print(' '.join(sorted(os.listdir('/'))))"
    run = _one(bwrap, job("root", command=py(code)), tmp_path)
    seen = set(run["stdout_tail"].split())
    assert {"usr", "etc", "workspace", "tmp", "proc", "dev"} <= seen, seen
    # anything else visible is an interpreter directory bound back for the command
    bound_back = {p.split("/")[1] for p in _interpreter_dirs()}
    assert not ({"srv", "opt", "mnt", "media", "boot"} & seen) - bound_back, seen
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "sys", "dev",
               "proc", "tmp", "root", "home", "run", "var", "workspace"}  # fmt: skip
    assert seen - allowed <= bound_back, seen - allowed


def _interpreter_dirs() -> list[str]:
    from claw_sandbox.backends.base import venv_paths

    return [p for p in venv_paths([sys.executable]) if p.startswith("/")]


SYSCALL_PROBE = """
import ctypes, errno, subprocess, sys, threading
nr = {nr}
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = libc.syscall(nr[name], *args)
    return r if r >= 0 else errno.errorcode.get(ctypes.get_errno(), 'errno?')
print('add_key', call('add_key', b'user', b'claw-key', b'SECRET-PAYLOAD', 7, ctypes.c_long(-4)))
print('keyctl', call('keyctl', 0, ctypes.c_long(-4), 0))  # KEYCTL_GET_KEYRING_ID of @u
print('search', call('keyctl', 10, ctypes.c_long(-4), b'user', b'claw-key', 0))
u = subprocess.run(['unshare', '-U', 'true'], capture_output=True)
print('unshare', u.returncode)
t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()
print(subprocess.run(['sh', '-c', 'echo hi > f && cat f && rm f && ls -d /workspace'],
                     capture_output=True, text=True).stdout.replace(chr(10), ' '))
"""


def _probe_code() -> str:
    from claw_sandbox import _seccomp

    nrs = _seccomp.SYSCALLS.get(_seccomp.machine())
    if nrs is None or not shutil.which("unshare"):
        pytest.skip(f"no seccomp table for {_seccomp.machine()} or no unshare(1)")
    return SYSCALL_PROBE.replace("{nr}", repr(nrs))


def test_keyring_and_nested_namespaces_are_refused(bwrap, tmp_path):
    """keyctl/add_key fail with EPERM, `unshare -U` fails; threads, sh and file work still run."""
    (run,) = run_jobs([job("k", command=py(_probe_code()))], backend=bwrap, workdir=tmp_path)
    lines = dict(line.split(" ", 1) for line in run["stdout_tail"].splitlines())
    assert lines["add_key"] == "EPERM" and lines["keyctl"] == "EPERM", run
    assert lines["search"] == "EPERM"
    assert lines["unshare"] != "0"
    assert lines["thread"] == "ok"
    assert lines["hi"].strip() == "/workspace"


def test_a_key_stored_by_one_job_is_not_seen_by_the_next(bwrap, tmp_path):
    """The keyring attack: job 1 stores a key for its uid, job 2 (same uid) looks for it."""
    code = _probe_code()
    first, second = run_jobs(
        [job("store", command=py(code)), job("read", command=py(code))],
        backend=bwrap, workdir=tmp_path,
    )  # fmt: skip
    assert "add_key EPERM" in first["stdout_tail"], first
    assert "search EPERM" in second["stdout_tail"], second
    assert "SECRET-PAYLOAD" not in second["stdout_tail"]


def test_without_the_filter_nested_namespaces_would_work(tmp_path):
    """The control for the two tests above: with seccomp off, `unshare -U` succeeds here."""
    from claw_sandbox.backends.bwrap import BwrapBackend

    backend = BwrapBackend(seccomp=False)
    if backend.unavailable():
        pytest.skip(f"bwrap backend unavailable: {backend.unavailable()}")
    (run,) = run_jobs([job("u", command="unshare -U true && echo NESTED")], backend=backend,
                      workdir=tmp_path)  # fmt: skip
    if "NESTED" not in run["stdout_tail"]:
        pytest.skip(f"this kernel refuses nested user namespaces anyway: {run['stdout_tail']!r}")
    assert run["exit_code"] == 0
