"""The default seccomp program, checked by a small classic-BPF interpreter (the reference)."""

import errno
import struct

import pytest
from claw_sandbox import _seccomp

ALLOW = _seccomp.RET_ALLOW
EPERM = _seccomp.RET_ERRNO | errno.EPERM
ENOSYS = _seccomp.RET_ERRNO | errno.ENOSYS
CLONE_NEWUSER, CLONE_THREAD_FLAGS = 0x10000000, 0x003D0F00  # what pthread_create passes


def run_bpf(prog: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """Interpret the program on one struct seccomp_data, as the kernel would."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        pc += 1
        if code == 0x20:  # ld w abs
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("arch", sorted(_seccomp.SYSCALLS))
def test_denied_calls_get_eperm_and_the_rest_is_allowed(arch):
    """Every listed syscall the arch has gets EPERM; every other number below 500 is allowed."""
    prog, nrs = _seccomp.program(arch), _seccomp.SYSCALLS[arch]
    audit = _seccomp.AUDIT_ARCH[arch]
    denied = {nrs[n] for n in _seccomp.DENIED if n in nrs}
    special = {nrs["clone"], nrs["clone3"], nrs["unshare"]}
    assert len(denied) >= 40
    for nr in range(500):
        want = EPERM if nr in denied else ENOSYS if nr == nrs["clone3"] else ALLOW
        if nr in special - {nrs["clone3"]}:
            want = ALLOW
        assert run_bpf(prog, nr, audit) == want, (arch, nr)


@pytest.mark.parametrize("arch", sorted(_seccomp.SYSCALLS))
def test_new_namespaces_are_refused_but_threads_and_forks_are_not(arch):
    """clone/unshare with a CLONE_NEW* flag get EPERM; thread and fork flags pass."""
    prog, nrs = _seccomp.program(arch), _seccomp.SYSCALLS[arch]
    audit = _seccomp.AUDIT_ARCH[arch]
    for name in ("clone", "unshare"):
        assert run_bpf(prog, nrs[name], audit, CLONE_NEWUSER) == EPERM
        assert run_bpf(prog, nrs[name], audit, CLONE_NEWUSER | CLONE_THREAD_FLAGS) == EPERM
        assert run_bpf(prog, nrs[name], audit, 0x40000000) == EPERM  # CLONE_NEWNET
    assert run_bpf(prog, nrs["clone"], audit, CLONE_THREAD_FLAGS) == ALLOW
    assert run_bpf(prog, nrs["clone"], audit, 17) == ALLOW  # fork(): SIGCHLD
    assert run_bpf(prog, nrs["unshare"], audit, 0x00000400) == ALLOW  # CLONE_FILES


def test_other_architectures_are_killed_and_x32_refused():
    """A syscall under a foreign arch (i386 from x86_64) kills; x32 numbers get EPERM."""
    prog = _seccomp.program("x86_64")
    assert run_bpf(prog, 0, 0x40000003) == _seccomp.RET_KILL_PROCESS  # AUDIT_ARCH_I386
    assert run_bpf(prog, 0x40000000 | 1, _seccomp.AUDIT_ARCH["x86_64"]) == EPERM
    assert run_bpf(_seccomp.program("aarch64"), 63, _seccomp.AUDIT_ARCH["x86_64"]) == (
        _seccomp.RET_KILL_PROCESS
    )


def test_unknown_architecture_has_no_program():
    """Where no syscall table exists the backend runs unfiltered instead of guessing numbers."""
    assert _seccomp.program("riscv64") is None


@pytest.mark.parametrize("arch", sorted(_seccomp.SYSCALLS))
def test_no_call_reaches_another_process(arch):
    """ptrace, process_vm_readv / process_vm_writev and pidfd_getfd get EPERM: a job cannot take
    over its parent shell (and choose the exit code the runner sees) or any other process."""
    prog, nrs = _seccomp.program(arch), _seccomp.SYSCALLS[arch]
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"):
        assert run_bpf(prog, nrs[name], _seccomp.AUDIT_ARCH[arch]) == EPERM, (arch, name)
