"""A job that plants symlinks cannot make the runner read or write outside its workspace."""

import io
import os
import stat
import tarfile

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.workspace import chown_tree, collect, copy_into, read_inside, safe_write
from sandbox_testlib import job


@pytest.fixture(params=["bwrap", "process"])
def backend(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def host_dir(tmp_path):
    """A private host directory (0700) holding a 0600 secret, as in the reported escape."""
    d = tmp_path / "host"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    secret = d / "secret"
    secret.write_text("1")
    os.chmod(secret, 0o600)
    return d


def _snapshot(d):
    """Names, modes, owners and contents of a directory and its files."""
    out = {".": (stat.S_IMODE(os.lstat(d).st_mode), os.lstat(d).st_uid)}
    for name in sorted(os.listdir(d)):
        st = os.lstat(d / name)
        out[name] = (stat.S_IMODE(st.st_mode), st.st_uid, (d / name).read_bytes())
    return out


def _one(backend, row, tmp_path):
    (run,) = run_jobs([row], backend=backend, workdir=tmp_path / "w", retries=0)
    return run


def test_verify_copy_from_does_not_follow_a_planted_directory_link(backend, tmp_path, host_dir):
    """`ln -s /host/dir tests` before verify: the verifier's files replace the link, the host
    directory keeps its entries, modes and owners."""
    before = _snapshot(host_dir)
    src = tmp_path / "verifier"
    (src / "tests").mkdir(parents=True)
    (src / "tests" / "secret").write_text("overwritten")
    (src / "tests" / "check.sh").write_text("test -f tests/secret && ! test -L tests\n")
    row = job(
        "plant-dir",
        command=f"ln -s {host_dir} tests",
        verify={"command": "sh tests/check.sh", "copy_from": str(src)},
    )
    run = _one(backend, row, tmp_path)
    assert run["status"] == "ok" and run["verify"]["passed"], run
    assert _snapshot(host_dir) == before


def test_verify_files_do_not_follow_an_intermediate_link(backend, tmp_path, host_dir):
    """A link at a middle component (a -> /host/dir, files at a/b/...) is replaced, for inline
    verify files and for a verify tarball alike."""
    before = _snapshot(host_dir)
    tar = tmp_path / "verifier.tar"
    with tarfile.open(tar, "w") as t:
        data = b"from tar"
        info = tarfile.TarInfo("t/b/from-tar.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    row = job(
        "plant-mid",
        command=f"ln -s {host_dir} a; ln -s {host_dir} t",
        verify={
            "command": "test -f a/b/c.txt && test -f t/b/from-tar.txt && ! test -L a"
            " && ! test -L t",
            "files": {"a/b/c.txt": "verifier file"},
            "copy_from": str(tar),
        },
    )
    run = _one(backend, row, tmp_path)
    assert run["status"] == "ok" and run["verify"]["passed"], run
    assert _snapshot(host_dir) == before


def test_reward_file_linked_to_a_host_secret_is_not_read(backend, tmp_path, host_dir):
    """reward -> /host/secret (holding "1"), or a linked directory on its path: the secret is
    never read. A link the job left is removed before the verify step (the reward is then the
    verifier's exit code); one made during it (the verifier runs the job's code) is refused, with
    reward 0 and the details saying why."""
    for name, plant, reward_file in [
        ("direct", f"ln -s {host_dir}/secret reward", "reward"),
        ("via-dir", f"ln -s {host_dir} v", "v/secret"),
    ]:
        rows = [
            job(f"reward-{name}", command=plant,
                verify={"command": "exit 1", "reward_file": reward_file}),
            job(f"reward-{name}-at-verify",
                verify={"command": f"rm -rf {reward_file.split('/')[0]}; {plant}; exit 0",
                        "reward_file": reward_file}),
        ]  # fmt: skip
        runs = {
            r["job_id"]: r
            for r in run_jobs(rows, backend=backend, workdir=tmp_path / "w", retries=0)
        }
        left, made = runs[f"reward-{name}"], runs[f"reward-{name}-at-verify"]
        assert left["verify"]["reward"] == 0.0 and left["verify"]["details"] == {}, left
        assert made["verify"]["reward"] == 0.0, made
        assert "symlink" in made["verify"]["details"]["reward_file_error"]


def test_collect_and_cleanup_do_not_follow_planted_links(backend, tmp_path, host_dir):
    """Links to the host are neither collected nor entered by collect, and removing the job
    directory removes the links only."""
    before = _snapshot(host_dir)
    row = job(
        "plant-collect",
        command=f"mkdir out; echo mine > out/a.txt; ln -s {host_dir} out/host;"
        f" ln -s {host_dir}/secret out/s.txt; ln -s {host_dir} all",
        collect=["out/**", "all/*"],
    )
    run = _one(backend, row, tmp_path)
    assert run["collected"] == {"out/a.txt": "mine\n"}, run
    assert _snapshot(host_dir) == before
    assert os.listdir(tmp_path / "w") == []


def test_library_calls_refuse_links_in_the_workspace(tmp_path, host_dir):
    """copy_into, safe_write, read_inside and chown_tree each leave a linked host dir alone."""
    before = _snapshot(host_dir)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "d").symlink_to(host_dir)
    (ws / "f").symlink_to(host_dir / "secret")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "secret").write_text("x")
    os.chmod(src / "d", 0o755)
    copy_into(str(src), ws, "job")
    assert not (ws / "d").is_symlink() and (ws / "d" / "secret").read_text() == "x"
    (ws / "e").symlink_to(host_dir)
    safe_write(ws, "e/secret", "y")
    assert read_inside(ws, "f") is None
    if os.geteuid() == 0:
        chown_tree(ws, 12345, 12345)
        assert os.lstat(ws / "f").st_uid == 12345
    assert _snapshot(host_dir) == before
    assert collect(ws, ["**"])[0] == {"d/secret": "x", "e/secret": "y"}
