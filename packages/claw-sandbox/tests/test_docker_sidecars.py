"""Sidecars on docker reach no host address (hostile), and run confined like their job."""

import contextlib
import os
import socket
import subprocess
import threading

import pytest
from claw_sandbox import run_jobs
from sandbox_testlib import job
from test_docker import IMAGE, docker_backend  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

#: tries a TCP connection to every host address ($HOST_ADDRS) and every gateway in the routing
#: table (decoded from /proc/net/route's little-endian hex), one line per address
PROBE = r"""addrs="$HOST_ADDRS"
while read -r _ _ gw _; do
  case $gw in 00000000|Gateway) ;;
  *) addrs="$addrs $((0x${gw:6:2})).$((0x${gw:4:2})).$((0x${gw:2:2})).$((0x${gw:0:2}))" ;;
  esac
done < /proc/net/route
for a in $addrs; do
  if nc -w 2 "$a" "$PORT" </dev/null >/dev/null 2>&1; then echo "open $a"; else echo "closed $a"; fi
done
"""
#: the sidecar probes first, then serves what it found on port 8080 (healthy once it probed)
SIDECAR = (
    "(" + PROBE + ") > /tmp/probe 2>&1; touch /tmp/ready; "
    "while true; do (printf 'HTTP/1.0 200 OK\\r\\n\\r\\n'; cat /tmp/probe) | nc -l -p 8080; done"
)


def _host_addrs() -> list[str]:
    """The host's own IPv4 addresses but loopback (docker0 and every interface), from `ip`."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        pytest.skip("no `ip` (iproute2) on this host to list its addresses")
    addrs = [line.split()[3].split("/")[0] for line in out.splitlines() if " lo " not in line]
    if not addrs:
        pytest.skip("this host has no IPv4 address but loopback")
    return addrs


class _Listener:
    """A TCP server on 0.0.0.0 that records the local address of every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[tuple[str, str]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, peer = self.sock.accept()
                self.accepted.append((conn.getsockname()[0], peer[0]))
                conn.close()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.sock.close()


def test_job_and_sidecar_reach_no_host_address(docker_backend, tmp_path):  # noqa: F811
    """A listener on the host's 0.0.0.0 takes no connection from a job with a sidecar, nor from
    the sidecar, in the claw and harbor profiles, at any host address (every interface's, docker0's,
    the job network's gateway); the job still reaches its sidecar by name."""
    addrs = _host_addrs()
    listener = _Listener()
    env = {"HOST_ADDRS": " ".join(addrs), "PORT": str(listener.port)}
    web = {"name": "web", "image": IMAGE, "command": SIDECAR, "env": env,
           "healthcheck": {"command": "test -e /tmp/ready", "interval_s": 0.2, "retries": 300}}  # fmt: skip
    command = "echo sidecar-begin; wget -q -O- http://web:8080/; echo job-begin; " + PROBE
    jobs = [
        job("net-claw", image=IMAGE, command=command, env=env, services=[web], timeout_s=120),
        job("net-hb", image=IMAGE, command=command, env=env, services=[web], timeout_s=120,
            profile="harbor", workdir="/app"),
    ]  # fmt: skip
    try:
        runs = run_jobs(jobs, backend=docker_backend, workdir=tmp_path)
    finally:
        listener.close()
    assert listener.accepted == [], f"host addresses answered (address, peer): {listener.accepted}"
    for run in runs:
        out = run["stdout_tail"]
        assert run["status"] == "ok", run
        sidecar, _, own = out.partition("job-begin\n")
        for who, lines in (("sidecar", sidecar), ("job", own)):
            tried = [
                ln.split()[1] for ln in lines.splitlines() if ln.startswith(("open", "closed"))
            ]
            assert set(addrs) <= set(tried), (who, out)  # every host address was tried
            assert "open" not in lines, (who, out)


def test_sidecars_are_confined_like_their_job(docker_backend, tmp_path):  # noqa: F811
    """A claw-profile job's sidecar runs with all capabilities dropped, no-new-privileges, a
    read-only root and the job's memory and pids limits (read from the engine while the job runs);
    the firewall rule of its network is gone with the network."""
    from claw_sandbox.backends._docker_services import _fenced_bridges

    client = docker_backend.client()
    seen: dict = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and not seen:
            for c in client.containers.list(filters={"label": "claw-sandbox.job=confined"}):
                if c.attrs["Config"]["Hostname"] == "web":
                    seen.update(c.attrs["HostConfig"])
            stop.wait(0.1)

    web = {"name": "web", "image": IMAGE, "command": "sleep 60"}
    limits = {"memory_mb": 300, "pids": 77}
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        (run,) = run_jobs(
            [job("confined", image=IMAGE, command="sleep 3", services=[web], limits=limits)],
            backend=docker_backend, workdir=tmp_path,
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    assert run["status"] == "ok", run
    assert seen["CapDrop"] == ["ALL"] and seen["ReadonlyRootfs"] is True, seen
    assert "no-new-privileges" in seen["SecurityOpt"], seen
    assert seen["Memory"] == 300 * 2**20 and seen["PidsLimit"] == 77, seen
    assert [b for b in _fenced_bridges() if not os.path.exists(f"/sys/class/net/{b}")] == []
