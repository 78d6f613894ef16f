"""The pre-verify kill of a harbor trial container on docker spares nothing the agent can reach
(hostile): the container's keep-alive, hijacked through /proc/<pid>/mem, forges no reward."""

import platform

import pytest
from claw_sandbox import run_jobs
from sandbox_testlib import job
from test_docker import IMAGE, docker_backend  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

#: x86-64, position independent: forever { fd = open("/logs/verifier/reward.txt",
#: O_WRONLY|O_CREAT|O_TRUNC, 0644); write(fd, "1\n", 2); close(fd); nanosleep(20 ms) }
#: (`as` of: lea rdi,[rip+path]; mov esi,0x241; mov edx,0x1a4; mov eax,2; syscall; mov r12,rax;
#: mov edi,eax; lea rsi,[rip+one]; mov edx,2; mov eax,1; syscall; mov rdi,r12; mov eax,3;
#: syscall; lea rdi,[rip+ts]; xor esi,esi; mov eax,35; syscall; jmp start; then the data)
FORGER = bytes.fromhex(
    "488d3d57000000be41020000baa4010000b8020000000f054989c489c7488d3538000000ba02000000b8010000"
    "000f054c89e7b8030000000f05488d3d0b00000031f6b8230000000f05ebb4000000000000000000"
    "2d310100000000310a2f6c6f67732f76657269666965722f7265776172642e74787400"
)
#: the agent: finds the container's `sleep infinity` (not pid 1, which names it too), stops it,
#: writes FORGER over its code where its interrupted nanosleep resumes (pc - 2: the restart
#: re-executes the `syscall` instruction) and lets it go on; it then forges the reward file
HIJACK = r"""code='%s'
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = 1 ] || [ "$p" = $$ ] && continue
  grep -q infinity "$d/cmdline" 2>/dev/null && victim=$p
done
[ -n "$victim" ] || { echo "no keep-alive found"; exit 0; }
kill -STOP "$victim"
sleep 0.2
read -r _ _ _ _ _ _ _ _ pc < /proc/$victim/syscall
printf "$code" | dd of=/proc/$victim/mem bs=1 seek=$((pc - 2)) conv=notrunc 2>/dev/null
kill -CONT "$victim"
n=0
while [ $n -lt 50 ]; do
  [ "$(cat /logs/verifier/reward.txt 2>/dev/null)" = 1 ] && { echo hijacked; break; }
  sleep 0.1; n=$((n + 1))
done
"""


def test_hijacked_keepalive_forges_no_reward(docker_backend, tmp_path):  # noqa: F811
    """The agent turns the trial container's keep-alive into a loop that writes reward 1 (shown
    by the file it writes while the command runs); the verifier writes 0 and waits: the reward
    is 0.0, as nothing the agent touched runs on into the verify step."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the hijack's machine code is x86-64 (this host is {platform.machine()})")
    octal = "".join(f"\\{b:03o}" for b in FORGER)
    j = job(
        "keepalive", image=IMAGE, profile="harbor", workdir="/app", command=HIJACK % octal,
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "echo 0 > /logs/verifier/reward.txt; sleep 1",
                "reward_file": "/logs/verifier/reward.txt"},
    )  # fmt: skip
    (run,) = run_jobs([j], backend=docker_backend, workdir=tmp_path)
    assert run["stdout_tail"] == "hijacked\n", run  # the keep-alive ran the agent's code
    assert run["status"] == "ok" and run["verify"]["reward"] == 0.0, run


def test_a_broken_trial_container_is_a_failed_rollout(docker_backend, tmp_path):  # noqa: F811
    """An agent that kills its container's keep-alive (the container stops) or removes `sleep`
    (the container cannot come up again) gets reward 0.0 from a verify step that runs or fails,
    never an infra error with reward null, which would hide the failure."""
    verify = {"command": "echo 0 > /logs/verifier/reward.txt",
              "reward_file": "/logs/verifier/reward.txt"}  # fmt: skip
    kill = 'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || kill -9 "$p"; done'
    jobs = [
        job(job_id, image=IMAGE, profile="harbor", workdir="/app", command=command,
            mounts=[{"target": "/logs/verifier"}], verify=verify)
        for job_id, command in (("killed", kill), ("nosleep", "rm /bin/sleep"))
    ]  # fmt: skip
    runs = {r["job_id"]: r for r in run_jobs(jobs, backend=docker_backend, workdir=tmp_path)}
    assert runs["killed"]["verify"]["exit_code"] == 0, runs["killed"]  # it ran, on a restart
    assert runs["nosleep"]["verify"]["exit_code"] == 1, runs["nosleep"]
    assert "did not come up again" in runs["nosleep"]["verify"]["output"], runs["nosleep"]
    for run in runs.values():
        assert run["status"] != "infra_error" and run["verify"]["reward"] == 0.0, run


def test_the_proxy_answers_the_restarted_container(docker_backend, tmp_path):  # noqa: F811
    """A harbor job with policy proxy: its verify step, in the container started again, still
    reaches the proxy on 127.0.0.1:PORT (the forwarder follows the container's new namespace)."""
    import os
    import subprocess
    import sys

    from test_docker import _free_port

    if os.geteuid() != 0:
        pytest.skip("the docker proxy forwarder needs root (nsenter)")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from the proxy\n")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    get = "wget -q -O- http://127.0.0.1:18080/ > /logs/verifier/got"
    net = {"policy": "proxy", "proxy_url": f"http://127.0.0.1:{port}", "port": 18080}
    j = job("hbproxy", image=IMAGE, profile="harbor", workdir="/app", command=get, network=net,
            mounts=[{"target": "/logs/verifier"}], collect=["/logs/verifier/got"],
            verify={"command": get})  # fmt: skip
    try:
        (run,) = run_jobs([j], backend=docker_backend, workdir=tmp_path)
    finally:
        server.kill()
        server.wait()
    assert run["verify"]["exit_code"] == 0, run
    assert run["collected"]["/logs/verifier/got"] == "hello from the proxy\n", run
