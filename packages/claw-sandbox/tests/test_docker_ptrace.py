"""The docker backend's claw profile refuses what bwrap's seccomp filter refuses, ptrace first.

The job seccomp filter is one list (`_seccomp.DENIED`, `CLONE_NEW_FLAGS`); bwrap loads it as a
BPF program, docker as a profile generated from it (`_seccomp.docker_profile`). Under the engine's
default profile a job could ptrace its parent shell and make it exit with a code of its choosing
(measured: exit 127, the rest of the command never ran); under the claw profile it gets EPERM.

The programs run in the containers are a few hundred bytes of x86_64 machine code wrapped in a
minimal static ELF here, so the test image needs only a static busybox (no compiler, no libc)."""

import errno
import hashlib
import io
import json
import platform
import shutil
import struct
import subprocess
import tarfile

import pytest
from claw_sandbox import _seccomp, run_jobs
from claw_sandbox.backends import make_backend
from sandbox_testlib import job
from test_seccomp import run_bpf

# test_runner_decides.py's attack, in machine code: getppid; ptrace(PTRACE_ATTACH, ppid);
# wait4(ppid, 0, __WALL); ptrace(PTRACE_SYSCALL, ppid); wait4 (the parent shell stopped at the
# entry of its restarted wait4); PTRACE_GETREGS; orig_rax = 231 (exit_group), rdi = 127;
# PTRACE_SETREGS; PTRACE_DETACH; write "ptrace: attached\n", exit 0. When PTRACE_ATTACH fails:
# write "ptrace: refused\n" and exit with its errno. Assembled (GNU as) from:
#     mov $110,%eax; syscall; mov %rax,%r12
#     mov $101,%eax; mov $16,%edi; mov %r12,%rsi; xor %edx,%edx; xor %r10d,%r10d; syscall
#     test %rax,%rax; jnz denied; call wait
#     mov $101,%eax; mov $24,%edi; mov %r12,%rsi; xor %edx,%edx; xor %r10d,%r10d; syscall
#     call wait; sub $216,%rsp
#     mov $101,%eax; mov $12,%edi; mov %r12,%rsi; xor %edx,%edx; mov %rsp,%r10; syscall
#     movq $231,120(%rsp); movq $127,112(%rsp)
#     mov $101,%eax; mov $13,%edi; mov %r12,%rsi; xor %edx,%edx; mov %rsp,%r10; syscall
#     mov $101,%eax; mov $17,%edi; mov %r12,%rsi; xor %edx,%edx; xor %r10d,%r10d; syscall
#     xor %ebx,%ebx; lea attached(%rip),%rsi; mov $17,%edx; jmp out
#   denied: neg %rax; mov %rax,%rbx; lea refused(%rip),%rsi; mov $16,%edx
#   out: mov $1,%eax; mov $1,%edi; syscall; mov $60,%eax; mov %rbx,%rdi; syscall
#   wait: mov $61,%eax; mov %r12,%rdi; xor %esi,%esi; mov $0x40000000,%edx; xor %r10d,%r10d
#     syscall; ret
#   attached: .ascii "ptrace: attached\n"
#   refused: .ascii "ptrace: refused\n"
ATTACK = bytes.fromhex(
    "b86e0000000f054989c4b865000000bf100000004c89e631d24531d20f054885c00f8583000000e8a6000000"
    "b865000000bf180000004c89e631d24531d20f05e88d0000004881ecd8000000b865000000bf0c0000004c89"
    "e631d24989e20f0548c7442478e700000048c74424707f000000b865000000bf0d0000004c89e631d24989e2"
    "0f05b865000000bf110000004c89e631d24531d20f0531db488d3544000000ba11000000eb1248f7d84889c3"
    "488d3541000000ba10000000b801000000bf010000000f05b83c0000004889df0f05b83d0000004c89e731f6"
    "ba000000404531d20f05c37074726163653a2061747461636865640a7074726163653a20726566757365640a"
)
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
# one syscall with constant arguments; the program's exit status is its errno (0: it succeeded)
PROBES = {
    "pidfd_getfd": (438, -1 & 0xFFFFFFFF, 0, 0),  # EBADF when allowed
    "process_vm_readv": (310, 1, 0, 1, 0, 1),  # a NULL iovec: EFAULT when allowed
    "unshare": (272, CLONE_NEWUSER),  # an unprivileged user namespace: 0 when allowed
    "clone": (56, CLONE_NEWUSER | SIGCHLD),
    "clone3": (435, 0, 0),  # a NULL struct of size 0: EINVAL when allowed
}
ALLOWED = {"pidfd_getfd": errno.EBADF, "process_vm_readv": errno.EFAULT, "unshare": 0,
           "clone3": errno.EINVAL}  # fmt: skip
TOOLS = ["sh", "echo", "true", "unshare", "mount", "cat", "grep"]

pytestmark = pytest.mark.slow


def _probe(nr: int, *args: int) -> bytes:
    """mov $nr,%eax; args into edi, esi, edx, r10d, r8d, r9d; syscall; exit(-rax)."""
    regs = (b"\xbf", b"\xbe", b"\xba", b"\x41\xba", b"\x41\xb8", b"\x41\xb9")
    code = b"\xb8" + struct.pack("<I", nr)
    for reg, arg in zip(regs, (*args, 0, 0, 0, 0, 0, 0)[:6], strict=True):
        code += reg + struct.pack("<I", arg)
    return code + b"\x0f\x05\x48\xf7\xd8\x89\xc7\xb8\x3c\x00\x00\x00\x0f\x05"


def _elf(code: bytes) -> bytes:
    """A static x86_64 executable: one read+execute segment, the code right after the headers."""
    base, start = 0x400000, 64 + 56
    size = start + len(code)
    ehdr = struct.pack("<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 2, 62, 1,
                       base + start, 64, 0, 0, 64, 56, 1, 0, 0, 0)  # fmt: skip
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return ehdr + phdr + code


def _rootfs() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))

        with open(shutil.which("busybox") or "", "rb") as f:
            add("bin/busybox", f.read())
        for tool in TOOLS:
            info = tarfile.TarInfo(f"bin/{tool}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        add("bin/attack", _elf(ATTACK))
        for name, probe in PROBES.items():
            add(f"bin/probe-{name}", _elf(_probe(*probe)))
        for d in ("tmp", "workspace", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="module")
def docker_image():
    """(backend, image): the docker backend and an image of static busybox and the programs."""
    if platform.machine() != "x86_64":
        pytest.skip(f"the programs run in the containers are x86_64 code, not {platform.machine()}")
    backend = make_backend("docker")
    reason = backend.unavailable()
    if reason:
        pytest.skip(f"docker backend unavailable: {reason}")
    busybox = shutil.which("busybox")
    ldd = subprocess.run(["ldd", busybox or "/"], capture_output=True, text=True)
    if not busybox or (ldd.returncode == 0 and "not a dynamic" not in ldd.stdout + ldd.stderr):
        pytest.skip(
            "no static busybox to build the test image from (apt-get install busybox-static)"
        )
    import docker.errors

    data = _rootfs()
    image = f"claw-sandbox-test:ptrace-{hashlib.sha256(data).hexdigest()[:12]}"
    client = backend.client()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        repo, tag = image.split(":")
        client.api.import_image_from_data(data, repository=repo, tag=tag)
    return backend, image


PROBE_CMD = "; ".join(f"/bin/probe-{n}; echo {n}=$?" for n in PROBES)
ATTACK_CMD = "/bin/attack; echo attack=$?; echo survived"


def _results(out: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (line.partition("=") for line in out.split()) if v.isdigit()}


def test_ptrace_attack_is_refused_on_docker(docker_image, tmp_path):
    """The attack on the parent shell gets EPERM: the shell goes on, its exit code is its own.
    Under the engine's default profile (before) the shell exited 127 and `survived` never ran."""
    backend, image = docker_image
    row = job("attack", image=image, command=ATTACK_CMD, verify={"command": "exit 1"})
    (run,) = run_jobs([row], backend=backend, retries=0, workdir=tmp_path)
    out = run["stdout_tail"]
    assert "ptrace: refused" in out and "attack=1" in out and "survived" in out, run
    assert run["status"] == "ok" and run["exit_code"] == 0, run
    assert run["verify"]["reward"] == 0.0, run


def test_the_profile_refuses_what_bwrap_refuses(docker_image, tmp_path):
    """pidfd_getfd and process_vm_readv get EPERM, an unprivileged user namespace (unshare or
    clone with CLONE_NEWUSER, busybox's `unshare -U`) EPERM, clone3 ENOSYS; a mount still fails;
    forks and pipes work."""
    backend, image = docker_image
    cmd = (f"{PROBE_CMD}; unshare -U true; echo unshare-U=$?; mount -t tmpfs none /tmp; "
           "echo mount=$?; echo piped | cat; grep -c Seccomp: /proc/self/status")  # fmt: skip
    (run,) = run_jobs([job("probes", image=image, command=cmd)], backend=backend, workdir=tmp_path)
    got = _results(run["stdout_tail"])
    want = {n: errno.ENOSYS if n == "clone3" else errno.EPERM for n in PROBES}
    assert {n: got.get(n) for n in PROBES} == want, run
    assert got["unshare-U"] != 0 and got["mount"] != 0, run
    assert "piped" in run["stdout_tail"], run


def test_the_probes_tell_without_the_profile(docker_image):
    """The control, with the claw profile's other flags: under the engine's default profile the
    attack makes the parent shell exit 127 (the test above fails there), and with no seccomp at
    all each probe gets the kernel's own answer, not EPERM."""
    backend, image = docker_image
    client = backend.client()
    flags = dict(user="65534:65534", cap_drop=["ALL"], read_only=True, init=True,
                 network_mode="none")  # fmt: skip

    def run(cmd: str, security_opt: list[str]) -> tuple[int, str]:
        c = client.containers.create(image, ["/bin/sh", "-c", cmd], security_opt=security_opt,
                                     **flags)  # fmt: skip
        try:
            c.start()
            code = c.wait(timeout=60)["StatusCode"]
            return code, c.logs().decode()
        finally:
            c.remove(force=True)

    code, out = run(ATTACK_CMD, ["no-new-privileges"])
    if "ptrace: refused" in out:
        pytest.skip(f"this host refuses ptrace to the parent even without the profile: {out!r}")
    # (its "ptrace: attached" may be lost: the container ends with the shell, it with it)
    assert code == 127 and "survived" not in out, (code, out)
    code, out = run(PROBE_CMD, ["no-new-privileges", "seccomp=unconfined"])
    got, allowed = _results(out), dict(ALLOWED)
    if got.get("unshare") != 0:  # the host forbids unprivileged user namespaces by itself
        del allowed["unshare"]
    assert {n: got.get(n) for n in allowed} == allowed, out


def _docker_verdict(profile: dict, name: str, arg0: int, arg1: int = 0, arch: str = "amd64"):
    """What the profile does to one call (the engine's rule matching): (action, errno)."""
    for rule in profile["syscalls"]:
        if name not in rule["names"]:
            continue
        if arch in rule.get("excludes", {}).get("arches", []):
            continue
        if "arches" in rule.get("includes", {}) and arch not in rule["includes"]["arches"]:
            continue
        args = (arg0, arg1)
        if all(args[a["index"]] & a["value"] == a["valueTwo"] for a in rule.get("args", [])):
            assert all(a["op"] == "SCMP_CMP_MASKED_EQ" for a in rule.get("args", []))
            return rule["action"], rule.get("errnoRet")
    return profile["defaultAction"], None


@pytest.mark.parametrize("arch", sorted(_seccomp.SYSCALLS))
def test_the_docker_profile_is_the_bwrap_filter(arch):
    """One source: for every syscall bwrap's table names and a spread of clone/unshare flags
    (each CLONE_NEW* bit alone and with thread flags, fork's, none), the docker profile gives
    the verdict the BPF program gives."""
    profile = json.loads(_seccomp.docker_profile())
    prog, nrs, audit = _seccomp.program(arch), _seccomp.SYSCALLS[arch], _seccomp.AUDIT_ARCH[arch]
    verdicts = {
        "SCMP_ACT_ALLOW": lambda e: _seccomp.RET_ALLOW,
        "SCMP_ACT_ERRNO": lambda e: _seccomp.RET_ERRNO | e,
    }
    bits = [1 << i for i in range(32) if _seccomp.CLONE_NEW_FLAGS >> i & 1]
    flags = [0, SIGCHLD, 0x003D0F00, *bits, *(b | 0x003D0F00 for b in bits)]
    goarch = {"x86_64": "amd64", "aarch64": "arm64"}[arch]
    for name, nr in nrs.items():
        for arg0 in flags if name in ("clone", "unshare") else [0]:
            action, err = _docker_verdict(profile, name, arg0, arch=goarch)
            assert verdicts[action](err) == run_bpf(prog, nr, audit, arg0), (name, hex(arg0))
    # the x86_64 table's calls aarch64 lacks are in the profile too (by name, any arch)
    assert set(_seccomp.DENIED) <= {n for r in profile["syscalls"] for n in r["names"]}
    # on s390x clone's flags are its second argument
    assert _docker_verdict(profile, "clone", 0, CLONE_NEWUSER, "s390x")[0] == "SCMP_ACT_ERRNO"
    assert _docker_verdict(profile, "clone", CLONE_NEWUSER, 0, "s390x")[0] == "SCMP_ACT_ALLOW"
