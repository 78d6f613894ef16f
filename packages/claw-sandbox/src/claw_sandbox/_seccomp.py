"""The default seccomp filter for sandboxed steps, as a classic BPF program bwrap loads (--seccomp).

In the spirit of Docker's default profile: everything is allowed except syscalls that reach
kernel-global state or widen the sandbox, which fail with EPERM:
- the kernel keyrings (`keyctl`, `add_key`, `request_key`): keys are per uid, not per sandbox,
  so jobs running as the same uid would otherwise share them;
- new namespaces (`unshare`, `clone` with any CLONE_NEW* flag, `setns`): no nested user
  namespaces, which would give a job capabilities over its own mounts and network;
- mounts (`mount`, `umount2`, `pivot_root`, the new mount API), kernel modules, kexec, reboot,
  swap, clock and accounting changes, quotas, `syslog`, `bpf`, `perf_event_open`,
  `userfaultfd`, `io_uring_*`, `kcmp`, `process_vm_*`, file handles, `lookup_dcookie`,
  and the legacy x86 calls (`iopl`, `ioperm`, `uselib`, `sysfs`, `_sysctl`, ...).
`clone3` gets ENOSYS (its flags sit in memory a filter cannot read), so the C library falls
back to `clone`, whose flags the filter checks. A syscall made under another architecture
(32-bit `int 0x80` from an x86_64 process) kills the process; x32 syscalls get EPERM.
`ptrace` is denied too (as are `process_vm_readv` / `process_vm_writev` and `pidfd_getfd`,
which take the same permission): a job cannot trace, read, write or take file descriptors from
any process, its own included, so an agent cannot take over its parent shell (and
choose the exit code the runner reports) or a verifier the runner starts later. The cost: tools
built on ptrace (`gdb`, `strace`, `ltrace`, sanitizers' leak checks, some profilers) fail with
EPERM inside a job. No exit code is trusted either way (the runner decides infra errors from its
own lookup, see executor). The docker backend's claw profile gets this same list as a Docker
seccomp profile (`docker_profile()`, at the end), in place of the engine's default profile, which
allows ptrace on current kernels; its Harbor profile keeps the engine's default.
`program()` supports x86_64 and aarch64; elsewhere it returns None and bwrap steps run
unfiltered (`docker_profile()` names syscalls, which the engine resolves on any architecture).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import platform
import struct

# <linux/audit.h>, <linux/seccomp.h>, <linux/sched.h>
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME (unshare only)
)

DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup",
    "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie",
    "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "process_vm_readv",
    "pidfd_getfd", "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key",
    "setns", "settimeofday", "swapoff", "swapon", "syslog", "sysfs", "_sysctl", "umount2",
    "uselib", "userfaultfd", "ustat", "vhangup",
)  # fmt: skip

# syscall numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64)
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "acct": 163, "add_key": 248, "bpf": 321, "clock_adjtime": 305, "clock_settime": 227,
        "clone": 56, "clone3": 435, "create_module": 174, "delete_module": 176,
        "finit_module": 313, "fsconfig": 431, "fsmount": 432, "fsopen": 430, "fspick": 433,
        "get_kernel_syms": 177, "init_module": 175, "io_uring_enter": 426,
        "io_uring_register": 427, "io_uring_setup": 425, "ioperm": 173, "iopl": 172,
        "kcmp": 312, "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250,
        "lookup_dcookie": 212, "mount": 165, "mount_setattr": 442, "move_mount": 429,
        "name_to_handle_at": 303, "nfsservctl": 180, "open_by_handle_at": 304, "open_tree": 428,
        "perf_event_open": 298, "pivot_root": 155, "process_vm_readv": 310,
        "pidfd_getfd": 438, "process_vm_writev": 311, "ptrace": 101, "query_module": 178, "quotactl": 179, "quotactl_fd": 443,
        "reboot": 169, "request_key": 249, "setns": 308, "settimeofday": 164, "swapoff": 168,
        "swapon": 167, "syslog": 103, "sysfs": 139, "_sysctl": 156, "umount2": 166,
        "unshare": 272, "uselib": 134, "userfaultfd": 323, "ustat": 136, "vhangup": 153,
    },
    "aarch64": {
        "acct": 89, "add_key": 217, "bpf": 280, "clock_adjtime": 266, "clock_settime": 112,
        "clone": 220, "clone3": 435, "delete_module": 106, "finit_module": 273, "fsconfig": 431,
        "fsmount": 432, "fsopen": 430, "fspick": 433, "init_module": 105, "io_uring_enter": 426,
        "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 272, "kexec_file_load": 294,
        "kexec_load": 104, "keyctl": 219, "lookup_dcookie": 18, "mount": 40,
        "mount_setattr": 442, "move_mount": 429, "name_to_handle_at": 264, "nfsservctl": 42,
        "open_by_handle_at": 265, "open_tree": 428, "perf_event_open": 241, "pivot_root": 41,
        "pidfd_getfd": 438, "process_vm_readv": 270, "process_vm_writev": 271, "ptrace": 117, "quotactl": 60, "quotactl_fd": 443,
        "reboot": 142, "request_key": 218, "setns": 268, "settimeofday": 170, "swapoff": 225,
        "swapon": 224, "syslog": 116, "umount2": 39, "unshare": 97, "userfaultfd": 282,
        "vhangup": 58,
    },
}  # fmt: skip

# classic BPF opcodes (<linux/filter.h>)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data (little-endian: low word)


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@functools.cache
def program(arch: str | None = None) -> bytes | None:
    """The compiled filter (struct sock_filter[]) for `arch` (default: this machine), or None."""
    arch = arch or machine()
    if arch not in SYSCALLS:
        return None
    nrs = SYSCALLS[arch]
    # (code, jt label or offset, jf label or offset, k); labels are resolved below
    ins: list[tuple[int, int | str, int | str, int]] = [
        (LD_W_ABS, 0, 0, ARCH_OFFSET),
        (JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, NR_OFFSET),
    ]
    if arch == "x86_64":
        ins.append((JGE_K, "eperm", 0, X32_SYSCALL_BIT))
    ins += [(JEQ_K, "eperm", 0, nrs[name]) for name in DENIED if name in nrs]
    ins += [
        (JEQ_K, "enosys", 0, nrs["clone3"]),
        (JEQ_K, "flags", 0, nrs["clone"]),
        (JEQ_K, "flags", 0, nrs["unshare"]),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    labels = {"flags": len(ins)}
    ins += [(LD_W_ABS, 0, 0, ARG0_OFFSET), (JSET_K, "eperm", "allow", CLONE_NEW_FLAGS)]
    labels["eperm"] = len(ins)
    ins.append((RET_K, 0, 0, RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(ins)
    ins.append((RET_K, 0, 0, RET_ERRNO | errno.ENOSYS))
    labels["allow"] = len(ins)
    ins.append((RET_K, 0, 0, RET_ALLOW))
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(ins):
        jt_off = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf_off = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt_off < 256 and 0 <= jf_off < 256, "jump out of range"
        out += struct.pack("<HBBI", code, jt_off, jf_off, k)
    return bytes(out)


def program_fd() -> int | None:
    """A readable pipe holding the filter for `bwrap --seccomp FD` (the caller closes it)."""
    data = program()
    if data is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, data)  # a few hundred bytes: far below the pipe buffer
    finally:
        os.close(w)
    return r


# Docker's seccomp profile format (moby's profiles/seccomp): a syscall's rules are ORed, the
# conditions of one rule ANDed; SCMP_CMP_MASKED_EQ holds when (arg & value) == valueTwo. Engines
# match archMap and includes/excludes against their Go architecture name.
DOCKER_ARCH_MAP = (
    {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
    {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
)
CLONE_FLAGS_SECOND = ["s390", "s390x"]  # clone(stack, flags, ...) there; (flags, ...) elsewhere


@functools.cache
def docker_profile() -> str:
    """The same filter as a Docker seccomp profile, JSON for `--security-opt seccomp=<json>`.

    Built from DENIED and CLONE_NEW_FLAGS above, so the docker backend's claw profile refuses
    exactly what bwrap's filter refuses: every DENIED syscall (ptrace, pidfd_getfd,
    process_vm_* included) gets EPERM, so do `clone` and `unshare` with any CLONE_NEW* flag
    (one masked rule per flag), `clone3` gets ENOSYS, everything else is allowed. It replaces
    the engine's default profile (a container has one), by name rather than number, so it
    needs no table per architecture; the engine's 32-bit sub-architectures (x86 and x32 under
    x86_64, arm under aarch64) get the same rules where bwrap kills or refuses them. `errnoRet`
    needs Docker 20.10 or later (older engines drop it, and `clone3` would get EPERM)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    bits = [1 << i for i in range(32) if CLONE_NEW_FLAGS >> i & 1]

    def masked(index: int, bit: int) -> list[dict]:
        return [{"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}]

    rules: list[dict] = [
        {"names": sorted(DENIED), **eperm},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    for bit in bits:
        rules += [
            {"names": ["unshare"], **eperm, "args": masked(0, bit)},
            {"names": ["clone"], **eperm, "args": masked(0, bit),
             "excludes": {"arches": CLONE_FLAGS_SECOND}},
            {"names": ["clone"], **eperm, "args": masked(1, bit),
             "includes": {"arches": CLONE_FLAGS_SECOND}},
        ]  # fmt: skip
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "archMap": list(DOCKER_ARCH_MAP),
        "syscalls": rules,
    }
    return json.dumps(profile, separators=(",", ":"))
