"""Host-side workspace handling never follows a symlink planted by the job."""

import io
import os
import tarfile

import pytest
from claw_sandbox import JobError
from claw_sandbox.workspace import build_workspace, collect, copy_into, parse_reward, safe_write


def test_safe_write_replaces_planted_symlinks(tmp_path):
    """A symlinked directory or file in the workspace is replaced, not written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".verify").symlink_to(outside)
    (ws / "f").symlink_to(outside / "target")
    safe_write(ws, ".verify/check.py", "x")
    safe_write(ws, "f", "y")
    assert os.listdir(outside) == []
    assert (ws / ".verify" / "check.py").read_text() == "x" and not (ws / ".verify").is_symlink()
    assert (ws / "f").read_text() == "y"


def test_collect_skips_links_outside_and_matches_globs(tmp_path):
    """Globs match inside the workspace; a symlink to a host file is not collected."""
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    ws = tmp_path / "ws"
    build_workspace(ws, {"out/a.txt": "A", "out/sub/b.txt": "B", "c.log": "C"}, None, "job")
    (ws / "out" / "leak.txt").symlink_to(secret)
    got = collect(ws, ["out/**/*.txt", "*.log"])
    assert got == ({"out/a.txt": "A", "out/sub/b.txt": "B", "c.log": "C"}, None)


def test_copy_from_directory_and_tarball(tmp_path):
    """copy_from takes a directory or a tarball; inline files are laid over it."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x").write_text("from dir")
    ws = tmp_path / "ws"
    build_workspace(ws, {"d/y": "inline"}, str(src), "job")
    assert (ws / "d" / "x").read_text() == "from dir" and (ws / "d" / "y").read_text() == "inline"
    tar = tmp_path / "t.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        data = b"from tar"
        info = tarfile.TarInfo("pkg/file.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    ws2 = tmp_path / "ws2"
    build_workspace(ws2, {}, str(tar), "job")
    assert (ws2 / "pkg" / "file.txt").read_text() == "from tar"


def test_copy_from_rejects_escaping_tarball_and_missing_source(tmp_path):
    """A tarball member with `..` and a missing source are per-job errors."""
    tar = tmp_path / "evil.tar"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("../evil")
        t.addfile(info, io.BytesIO(b""))
    with pytest.raises(JobError, match="escapes the workspace"):
        copy_into(str(tar), tmp_path / "ws", "job 'x'")
    with pytest.raises(JobError, match="does not exist"):
        copy_into(str(tmp_path / "nope"), tmp_path / "ws", "job 'x'")


@pytest.mark.parametrize(
    ("text", "reward", "details"),
    [("1", 1.0, {}), ("0.25\n", 0.25, {}), ('{"a": 1, "b": 0.5}', 0.75, {"a": 1.0, "b": 0.5})],
)
def test_parse_reward(text, reward, details):
    """A float, or the mean of named sub-scores."""
    assert parse_reward(text) == (reward, details)


@pytest.mark.parametrize("text", ["1.5", "-0.1", "nan", "yes", "{}", '{"a": "x"}', "true", "[0.5]"])
def test_parse_reward_rejects(text):
    """Values outside [0, 1] or of the wrong shape are errors."""
    with pytest.raises(ValueError):
        parse_reward(text)


def test_copy_from_rejects_tarball_link_to_the_host(tmp_path):
    """A tarball symlink pointing at a host path is refused, not extracted."""
    tar = tmp_path / "link.tar"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("etc-link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    with pytest.raises(JobError, match="copy_from"):
        copy_into(str(tar), tmp_path / "ws", "job 'x'")
    assert not (tmp_path / "ws" / "etc-link").is_symlink()


def test_job_directory_names_are_bounded_and_safe():
    """A 128-character job id gives a 41-character directory name; odd characters become `_`."""
    from pathlib import Path

    from claw_sandbox.executor import jobdir_for

    root = Path("/tmp/claw-sandbox-abcdefgh")
    assert len(jobdir_for(root, "s" * 128).name) == 32 + 1 + 8
    assert jobdir_for(root, "a/b c").name.startswith("a_b_c-")
    assert jobdir_for(root, "x") != jobdir_for(root, "x")


def test_collect_glob_matching_directories_returns_only_files(tmp_path):
    """`**` matches directories too; they are skipped, the files under them collected."""
    from claw_sandbox.workspace import collect

    (tmp_path / "out" / "deep").mkdir(parents=True)
    (tmp_path / "out" / "deep" / "a.txt").write_text("a")
    (tmp_path / "top.txt").write_text("t")
    assert collect(tmp_path, ["**"]) == ({"out/deep/a.txt": "a", "top.txt": "t"}, None)
