"""Clearing the verifier's places before a verify step (`_reward`), host side and without a
backend: whatever a job left at the reward path goes, however it set modes or links, and the
directories on the way come back as real directories the sandbox user can write."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from claw_sandbox._reward import reset_dir, reset_file
from claw_sandbox.errors import JobError
from claw_sandbox.records import Job
from sandbox_testlib import job


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _plant(ws: Path, outside: Path) -> None:
    """What a job may leave: a read-only reward in a read-only directory, a link, a fifo, a
    read-only tree and a 10 GB sparse file at reward paths, a parent that links outside."""
    (ws / "ro").mkdir()
    (ws / "ro" / "reward").write_text("1")
    os.chmod(ws / "ro" / "reward", 0o444)
    os.chmod(ws / "ro", 0o555)
    (outside / "reward").write_text("1")
    os.symlink(outside / "reward", ws / "link")
    os.symlink(outside, ws / "linked")
    os.mkfifo(ws / "fifo")
    (ws / "tree" / "a" / "b").mkdir(parents=True)
    (ws / "tree" / "a" / "b" / "f").write_text("1")
    for d in (ws / "tree" / "a" / "b", ws / "tree" / "a", ws / "tree"):
        os.chmod(d, 0o555)
    with open(ws / "huge", "wb") as f:
        f.truncate(10 << 30)
    os.chmod(ws, 0o555)


RESET = ["ro/reward", "link", "linked/reward", "fifo", "tree", "huge"]


def _check_cleared(ws: Path, outside: Path) -> None:
    for rel in RESET:
        assert not os.path.lexists(ws / rel), rel
    for d in (ws, ws / "ro", ws / "linked"):
        assert stat.S_ISDIR(os.lstat(d).st_mode) and _mode(d) == 0o755, d
    assert (outside / "reward").read_text() == "1"  # the link's target is untouched


def test_reset_file_removes_what_the_job_left(tmp_path):
    """Each kind of planted entry is removed; no link is followed; directories on the way are
    real, mode 0755, and given to the sandbox user."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    _plant(ws, outside)
    owner = (65534, 65534) if os.geteuid() == 0 else None
    for rel in RESET:
        reset_file(ws, rel, owner)
    _check_cleared(ws, outside)
    if owner:
        assert (os.lstat(ws / "ro").st_uid, os.lstat(ws / "linked").st_gid) == owner


def test_reset_file_as_a_runner_without_root():
    """A runner that is not root (its job runs as its own uid) can clear what the job left, even
    directories the job made unreadable (mode 000) or read-only."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv to drop to another uid")
    base = Path(tempfile.mkdtemp(prefix="claw-reset-"))
    try:
        os.chmod(base, 0o755)
        code = (
            "import os, sys\n"
            "from pathlib import Path\n"
            "sys.path.insert(0, sys.argv[2])\n"
            "from test_reward_reset import _plant, _check_cleared, RESET\n"
            "from claw_sandbox._reward import reset_file\n"
            "base = Path(sys.argv[1]); ws, out = base / 'ws', base / 'out'\n"
            "ws.mkdir(); out.mkdir(); _plant(ws, out)\n"
            "os.chmod(ws / 'ro', 0)\n"
            "for rel in RESET: reset_file(ws, rel, None)\n"
            "_check_cleared(ws, out)\n"
            "print('cleared')\n"
        )
        argv = [sys.executable, "-c", code, str(base), str(Path(__file__).parent)]
        if os.geteuid() == 0:
            os.chown(base, 65534, 65534)
            argv = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups",
                    *argv]  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and "Permission denied" in r.stderr and "import" in r.stderr:
            pytest.skip(f"uid 65534 cannot read this interpreter: {r.stderr.splitlines()[-1]}")
        assert r.stdout == "cleared\n", r.stderr
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_reset_dir_empties_a_directory_or_a_mount_root(tmp_path):
    """A reset directory comes back empty (a link there is replaced, not followed); with an empty
    path the root itself (a mount's directory) is emptied and stays."""
    root, outside = tmp_path / "mnt", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("x")
    (root / "reward.json").write_text('{"tests": 1}')
    (root / "sub").mkdir()
    (root / "sub" / "f").write_text("1")
    os.chmod(root / "sub", 0o555)
    os.symlink(outside, root / "v")
    reset_dir(root, "v", None)
    assert stat.S_ISDIR(os.lstat(root / "v").st_mode) and os.listdir(root / "v") == []
    assert os.listdir(outside) == ["keep"]
    os.chmod(root, 0o555)
    reset_dir(root, "", None)
    assert os.listdir(root) == [] and _mode(root) == 0o755


def _plant_deep_tree(root, name, depth):
    """root/name/a/a/.../a, `depth` levels below name (made by fd: the path is too long to name)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        os.mkdir(name, dir_fd=fd)
        cur = os.open(name, os.O_RDONLY, dir_fd=fd)
        for _ in range(depth):
            os.mkdir("a", dir_fd=cur)
            (Path(f"/proc/self/fd/{cur}") / "f").write_text("x")
            sub = os.open("a", os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = sub
        os.fchmod(cur, 0o500)  # the deepest directory read-only, as a job may leave it
        os.close(cur)
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path):
    """A directory tree at the reward path deeper than the interpreter's recursion limit (a
    RecursionError for shutil.rmtree on Python 3.11) is removed, and the path is free again."""
    _plant_deep_tree(tmp_path, "reward", sys.getrecursionlimit() + 100)
    reset_file(tmp_path, "reward", None)
    assert os.listdir(tmp_path) == []


def test_a_path_out_of_the_directory_is_refused(tmp_path):
    """An absolute or `..` path (a job reader bug) is an error, never a walk from / or above."""
    for rel in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(OSError, match="not a path inside"):
            reset_file(tmp_path, rel, None)
        with pytest.raises(OSError, match="not a path inside"):
            reset_dir(tmp_path, rel, None)


def test_verify_reset_is_checked():
    """`verify.reset`: a list of paths in the workspace, the workdir or a mount; never the
    workspace or workdir itself; written back as it was read."""
    base = job("r", verify={"command": "true", "reset": [".claw_verify"]})
    assert Job.from_dict(base).verify.reset == (".claw_verify",)
    assert Job.from_dict(base).to_dict()["verify"]["reset"] == [".claw_verify"]
    assert "reset" not in Job.from_dict(job("r", verify={"command": "true"})).to_dict()["verify"]
    harbor = {"profile": "harbor", "workdir": "/app", "mounts": [{"target": "/logs/verifier"}]}
    assert Job.from_dict(
        job("h", **harbor, verify={"command": "true", "reset": ["/logs/verifier", "/app/v"]})
    ).verify.reset == ("/logs/verifier", "/app/v")
    for bad, fields in [
        ("../x", {}), (".", {}), ("a", {"reset": "a"}), (3, {}), ("/app", harbor),
        ("/srv/x", harbor),
    ]:  # fmt: skip
        reset = fields.get("reset", [bad])
        extra = {k: v for k, v in fields.items() if k != "reset"}
        with pytest.raises(JobError, match="verify/reset"):
            Job.from_dict(job("b", **extra, verify={"command": "true", "reset": reset}))
