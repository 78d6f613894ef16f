"""OCI images without a daemon: unpacking layouts and `docker save` archives (layers, whiteouts,
hostile tars, the cache) and running a job in an image's root on bwrap."""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from claw_sandbox import _oci, run_jobs
from claw_sandbox.backends import make_backend
from claw_sandbox.errors import ImageError
from oci_testlib import config, docker_save, layer, oci_layout
from sandbox_testlib import job


def _base():
    return layer(("etc", "dir"), ("etc/passwd", "file", "root:x:0:0::/root:/bin/sh\n"),
                 ("etc/os", "file", "lower\n"), ("data", "dir"), ("data/old", "file", "old\n"))  # fmt: skip


def test_layers_apply_in_order_with_whiteouts(tmp_path):
    """A later layer replaces a file, `.wh.NAME` removes one, `.wh..wh..opq` empties a directory
    of what lower layers put there but keeps what its own layer adds; gzip and plain tars mix."""
    top = layer(("etc/os", "file", "upper\n"), ("etc/.wh.passwd", "file", ""),
                ("data/.wh..wh..opq", "file", ""), ("data/new", "file", "new\n"), gz=True)  # fmt: skip
    cfg = config(env=["PATH=/opt/tool/bin:/bin", "A=x=y"], workdir="/work", user="1234")
    image = _oci.unpack(oci_layout(tmp_path / "img", [_base(), top], cfg), tmp_path / "cache")
    root = image.rootfs
    assert (root / "etc/os").read_text() == "upper\n" and not (root / "etc/passwd").exists()
    assert sorted(os.listdir(root / "data")) == ["new"]
    assert image.env == {"PATH": "/opt/tool/bin:/bin", "A": "x=y"}
    assert (image.workdir, image.user) == ("/work", "1234")
    assert image.digest == "sha256:" + __import__("hashlib").sha256(cfg).hexdigest()
    assert root.parent.parent == tmp_path / "cache" and root.name == "rootfs"


def test_cached_by_digest_and_unpacked_once(tmp_path):
    """A second unpack of the same image (here as a `docker save` archive too) reuses the
    cached rootfs; nothing but the finished image is left in the cache."""
    cfg = config(layers=[_base()])  # diff_ids: the config digest alone is the key
    first = _oci.unpack(oci_layout(tmp_path / "img", [_base()], cfg), tmp_path / "cache")
    (first.rootfs / "marker").write_text("kept")
    second = _oci.unpack(docker_save(tmp_path / "img.tar", [_base()], cfg), tmp_path / "cache")
    assert second.rootfs == first.rootfs and (second.rootfs / "marker").read_text() == "kept"
    assert os.listdir(tmp_path / "cache") == [first.rootfs.parent.name]


def test_docker_save_archive(tmp_path):
    """A hand-made `docker save` tar (manifest.json with Config and Layers) unpacks the same."""
    top = layer(("opt/tool/bin/hello", "file", "#!/bin/sh\necho hi\n", 0o755))
    tar = docker_save(tmp_path / "img.tar", [_base(), top], config(workdir="/app"))
    image = _oci.unpack(tar, tmp_path / "cache")
    hello = image.rootfs / "opt/tool/bin/hello"
    assert hello.read_text().endswith("echo hi\n") and os.access(hello, os.X_OK)
    assert (image.rootfs / "data/old").exists() and image.workdir == "/app"


def _refused(tmp_path, layers, match):
    with pytest.raises(ImageError, match=match):
        _oci.unpack(oci_layout(tmp_path / "img", layers, config()), tmp_path / "refused")
    # nothing half-made is left: no image under its digest, no temporary directory
    assert not (tmp_path / "refused").exists() or os.listdir(tmp_path / "refused") == []


def test_dotdot_entry_is_refused(tmp_path):
    """A member named ../escape (or a/../../escape) is refused; nothing is written outside."""
    for name in ("../escape", "a/../../escape"):
        _refused(tmp_path, [layer((name, "file", "pwned"))], "leaves the root")
        shutil.rmtree(tmp_path / "img")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "refused" / "escape").exists()


def test_write_through_an_absolute_symlink_is_refused(tmp_path):
    """A symlink to a host directory, then a file under it (same layer or the next): refused,
    and the host directory stays empty."""
    host = tmp_path / "host"
    host.mkdir()
    same = layer(("etc", "sym", str(host)), ("etc/pwned", "file", "x"))
    _refused(tmp_path, [same], "through the symlink /etc")
    shutil.rmtree(tmp_path / "img")
    split = [layer(("etc", "sym", str(host))), layer(("etc/pwned", "file", "x"))]
    _refused(tmp_path, split, "through the symlink")
    shutil.rmtree(tmp_path / "img")
    whiteout = [layer(("etc", "sym", str(host))), layer(("etc/.wh.x", "file", ""))]
    _refused(tmp_path, whiteout, "through the symlink")
    assert os.listdir(host) == []


def test_whiteouts_remove_links_not_their_targets(tmp_path):
    """`.wh.etc` removes the image's /etc (a symlink to a host directory here), never the host's;
    an opaque marker under it cannot reach the host either."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep").write_text("host file")
    layers = [layer(("etc", "sym", str(host)), ("lib", "dir"), ("lib/x", "file", "x")),
              layer((".wh.etc", "file", ""), (".wh.lib", "file", ""))]  # fmt: skip
    image = _oci.unpack(oci_layout(tmp_path / "img", layers, config()), tmp_path / "cache")
    assert os.listdir(image.rootfs) == [] and (host / "keep").read_text() == "host file"
    assert Path("/etc").is_dir()


def test_hard_links_stay_inside_and_devices_are_skipped(tmp_path):
    """A hard link to a file of the image works; one to a path outside or to a symlink is
    refused; a device node is skipped with a note; setuid bits are dropped."""
    (tmp_path / "secret").write_text("host")
    ok = layer(("bin", "dir"), ("bin/su", "file", "x", 0o4755), ("bin/su2", "link", "bin/su"),
               ("dev", "dir"), ("dev/null", "chr"))  # fmt: skip
    image = _oci.unpack(oci_layout(tmp_path / "img", [ok], config()), tmp_path / "cache")
    assert os.stat(image.rootfs / "bin/su").st_ino == os.stat(image.rootfs / "bin/su2").st_ino
    assert not os.stat(image.rootfs / "bin/su").st_mode & stat.S_ISUID
    assert not (image.rootfs / "dev/null").exists() and "skipped 1 device" in image.notes[0]
    shutil.rmtree(tmp_path / "img")
    out = os.path.relpath(tmp_path / "secret", tmp_path / "cache")
    _refused(tmp_path, [layer(("s", "link", out))], "leaves the root")
    shutil.rmtree(tmp_path / "img")
    sym = layer(("p", "sym", str(tmp_path / "secret")), ("h", "link", "p"))
    _refused(tmp_path, [sym], "not a file of the image")


def test_bad_images_say_what_is_wrong(tmp_path):
    """A layer whose content does not match its digest, a directory that is no image and a
    file that is no tar are errors naming the problem."""
    with pytest.raises(ImageError, match="does not match its digest"):
        _oci.unpack(oci_layout(tmp_path / "img", [_base()], config(), bad_digest=True),
                    tmp_path / "cache")  # fmt: skip
    lie = config(layers=[layer(("x", "file", "other"))])  # a diff_id of another layer
    with pytest.raises(ImageError, match="does not match its diff_id"):
        _oci.unpack(docker_save(tmp_path / "lie.tar", [_base()], lie), tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageError, match="no index.json"):
        _oci.unpack(tmp_path / "empty", tmp_path / "cache")
    (tmp_path / "x.tar").write_text("not a tar")
    with pytest.raises(ImageError, match="neither an OCI image layout"):
        _oci.unpack(tmp_path / "x.tar", tmp_path / "cache")


def test_user_is_resolved_from_the_image(tmp_path):
    """USER by name, uid, name:group; the image's own /etc/passwd, never a host file it links."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\ntool:x:1234:1300::/home/t:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\nstaff:x:50:tool,root\n")
    assert _oci.resolve_user(tmp_path, "tool") == (1234, 1300)
    assert _oci.resolve_user(tmp_path, "tool:staff") == (1234, 50)
    assert _oci.resolve_user(tmp_path, "77:88") == (77, 88)
    assert _oci.resolve_user(tmp_path, "") == (0, 0)
    with pytest.raises(ImageError, match="no user 'nobody'"):
        _oci.resolve_user(tmp_path, "nobody")
    (etc / "passwd").unlink()
    (etc / "passwd").symlink_to("/etc/passwd")  # the host's root would resolve: must not
    with pytest.raises(ImageError, match="no user 'root'"):
        _oci.resolve_user(tmp_path, "root")


def _busybox() -> str:
    busybox = shutil.which("busybox")
    ldd = subprocess.run(["ldd", busybox], capture_output=True, text=True) if busybox else None
    if ldd is None or "not a dynamic" not in ldd.stdout + ldd.stderr:
        pytest.skip("a static busybox is needed to make an image (apt-get install busybox-static)")
    return busybox  # type: ignore[return-value]


def _tool_image(top: Path) -> list[bytes]:
    """Layers: a busybox root with a user `tool` (1234), then /opt/tool/bin/hello."""
    bb = Path(_busybox()).read_bytes()
    tools = ("sh", "id", "pwd", "cat", "echo", "ls")
    base = layer(("bin", "dir"), ("bin/busybox", "file-bytes", bb, 0o755),
                 *((f"bin/{t}", "sym", "busybox") for t in tools), ("work", "dir"),
                 ("etc", "dir"), ("etc/passwd", "file", "tool:x:1234:1234::/home/tool:/bin/sh\n"),
                 gz=True)  # fmt: skip
    hello = layer(("opt/tool/bin/hello", "file", "#!/bin/sh\necho hello from the image\n", 0o755))
    return [base, hello]


def test_a_job_runs_in_its_image_on_bwrap_without_a_daemon():
    """`hello` exists only in the image: the job passes with it (ENV PATH, WORKDIR /work with the
    job's files, USER tool = 1234, job env over image env) and fails on the host's root."""
    # not under pytest's tmp_path (mode 0700): bwrap may run as the sandbox's unprivileged uid
    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-oci-"))
    try:
        os.chmod(top, 0o755)
        cfg = config(env=["PATH=/opt/tool/bin:/bin", "A=img", "B=img"], workdir="/work",
                     user="tool")  # fmt: skip
        image = _oci.unpack(oci_layout(top / "img", _tool_image(top), cfg), top / "cache")
        backend = make_backend("bwrap", image=image)
        if backend.unavailable():
            pytest.skip(f"bwrap unavailable: {backend.unavailable()}")
        j = job("img", command='hello && echo "$PATH|$A|$B" && pwd && id -u && cat f.txt',
                env={"B": "job"}, workspace={"files": {"f.txt": "job file\n"}})  # fmt: skip
        (run,) = run_jobs([j], backend=backend, workdir=top / "jobs")
        assert run["exit_code"] == 0, run
        assert run["stdout_tail"] == (
            "hello from the image\n/opt/tool/bin:/bin|img|job\n/work\n1234\njob file\n"
        ), run
        host = make_backend("bwrap")
        (plain,) = run_jobs([j], backend=host, workdir=top / "jobs-host")
        assert plain["exit_code"] != 0 and "hello from the image" not in plain["stdout_tail"]
    finally:
        shutil.rmtree(top)


def test_cli_runs_jobs_in_a_docker_save_archive(monkeypatch):
    """`claw-sandbox run --oci IMAGE.tar` unpacks the archive and runs the jobs in it."""
    import json

    from claw_sandbox.cli import main
    from click.testing import CliRunner

    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-oci-cli-"))
    try:
        os.chmod(top, 0o755)
        monkeypatch.setenv("CLAW_SANDBOX_IMAGE_CACHE", str(top / "cache"))
        cfg = config(env=["PATH=/opt/tool/bin:/bin"], workdir="/work", user="1234")
        tar = docker_save(top / "img.tar", _tool_image(top), cfg)
        if make_backend("bwrap").unavailable():
            pytest.skip(f"bwrap unavailable: {make_backend('bwrap').unavailable()}")
        (top / "jobs.jsonl").write_text(json.dumps(job("c", command="hello; id -u")) + "\n")
        args = ["run", str(top / "jobs.jsonl"), "--oci", str(tar), "--workdir", str(top / "w")]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        run = json.loads(result.stdout.splitlines()[-1])
        assert run["stdout_tail"] == "hello from the image\n1234\n", run
        bad = CliRunner().invoke(main, [*args, "--backend", "process"])
        assert bad.exit_code != 0 and "--oci needs the bwrap backend" in bad.output
    finally:
        shutil.rmtree(top)


def test_cli_maps_image_names_to_archives(monkeypatch):
    """`--oci NAME=PATH`: a job whose `image` is NAME runs in that image; a job naming another
    image runs on the host's root as without --oci (there `hello` does not exist)."""
    import json

    from claw_sandbox.cli import main
    from click.testing import CliRunner

    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-oci-map-"))
    try:
        os.chmod(top, 0o755)
        monkeypatch.setenv("CLAW_SANDBOX_IMAGE_CACHE", str(top / "cache"))
        cfg = config(env=["PATH=/opt/tool/bin:/bin"], workdir="/work", user="tool")
        path = oci_layout(top / "img", _tool_image(top), cfg)
        if make_backend("bwrap").unavailable():
            pytest.skip(f"bwrap unavailable: {make_backend('bwrap').unavailable()}")
        rows = [job("in", command="hello", image="example.org/tool:1"),
                job("out", command="hello", image="example.org/other:1")]  # fmt: skip
        (top / "jobs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        args = ["run", str(top / "jobs.jsonl"), "--oci", f"example.org/tool:1={path}",
                "--workdir", str(top / "w")]  # fmt: skip
        result = CliRunner().invoke(main, args)
        runs = {r["job_id"]: r for r in map(json.loads, result.stdout.splitlines())}
        assert runs["in"]["exit_code"] == 0, runs
        assert runs["in"]["stdout_tail"] == "hello from the image\n"
        assert runs["out"]["exit_code"] != 0, runs
    finally:
        shutil.rmtree(top)


def test_a_killed_unpack_leaves_no_image_in_the_cache(tmp_path):
    """An unpack SIGKILLed in its first layer leaves only its temporary directory: no image under
    the key, so the next unpack does the whole work and gets every layer."""
    import sys

    img = oci_layout(tmp_path / "img", [_base(), layer(("late", "file", "x"))], config())
    child = (
        "import os, signal, sys\n"
        "from claw_sandbox import _oci\n"
        "def die(self, member, tar):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "_oci._Layer.apply = die\n"
        "_oci.unpack(sys.argv[1], sys.argv[2])\n"
    )
    proc = subprocess.run([sys.executable, "-c", child, str(img), str(tmp_path / "cache")])
    assert proc.returncode == -9
    left = os.listdir(tmp_path / "cache")
    assert len(left) == 1 and left[0].startswith(".unpack-"), left
    assert (tmp_path / "cache" / left[0] / _oci.LOCK).is_file()  # its owner's lock, now dropped
    image = _oci.unpack(img, tmp_path / "cache")
    assert (image.rootfs / "late").read_text() == "x" and (image.rootfs / "etc/os").exists()
    # the next unpack swept the dead unpacker's directory at once (no age to wait for)
    assert os.listdir(tmp_path / "cache") == [image.rootfs.parent.name]
    assert not (image.rootfs.parent / _oci.LOCK).exists()


def test_sweep_removes_only_abandoned_unpack_directories(tmp_path):
    """`.unpack-*` directories are swept when their lock file is not held (whatever modes a layer
    left inside), or, without a lock file, when older than STALE_AGE_S; a held one (an unpack at
    work) and a fresh one without a lock stay, and so does everything else in the cache."""
    import fcntl
    import time

    cache = tmp_path / "cache"
    for name in (".unpack-dead", ".unpack-live", ".unpack-old", ".unpack-fresh", "abc123"):
        (cache / name / "rootfs" / "usr").mkdir(parents=True)
    (cache / ".unpack-dead" / "rootfs" / "usr" / "f").write_text("x")
    (cache / ".unpack-dead" / "rootfs" / "usr").chmod(0o555)  # as a layer may leave it
    for name in (".unpack-dead", ".unpack-live"):
        (cache / name / _oci.LOCK).touch()
    held = os.open(cache / ".unpack-live" / _oci.LOCK, os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        two_hours_ago = time.time() - 2 * 3600
        os.utime(cache / ".unpack-old", (two_hours_ago, two_hours_ago))
        assert _oci.sweep(cache) == 2
        assert sorted(os.listdir(cache)) == sorted(["abc123", ".unpack-fresh", ".unpack-live"])
    finally:
        os.close(held)
    assert _oci.sweep(cache) == 1 and ".unpack-live" not in os.listdir(cache)  # lock dropped
    image = _oci.unpack(oci_layout(tmp_path / "img", [_base()], config()), cache)
    os.utime(cache / ".unpack-fresh", (0, 0))
    assert _oci.unpack(tmp_path / "img", cache) == image  # a cache hit sweeps too
    assert sorted(os.listdir(cache)) == sorted(["abc123", image.rootfs.parent.name])


def test_a_harbor_job_runs_in_its_image():
    """A `profile: "harbor"` job in an image: its workdir (over the image's WORKDIR), the
    image's USER, hello from the image, and the verify step's /tests copy all work."""
    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-oci-harbor-"))
    try:
        os.chmod(top, 0o755)
        cfg = config(env=["PATH=/opt/tool/bin:/bin"], workdir="/work", user="tool")
        image = _oci.unpack(oci_layout(top / "img", _tool_image(top), cfg), top / "cache")
        backend = make_backend("bwrap", images={"task:1": image})
        if backend.unavailable():
            pytest.skip(f"bwrap unavailable: {backend.unavailable()}")
        j = job(
            "hb", profile="harbor", image="task:1", workdir="/app",
            command="hello && id -u && pwd", mounts=[{"target": "/logs/verifier"}],
            verify={"command": "cat /tests/t", "mounts": [{"target": "/tests", "files": {"t": "v\n"}}]},
        )  # fmt: skip
        (run,) = run_jobs([j], backend=backend, workdir=top / "jobs")
        assert run["stdout_tail"] == "hello from the image\n1234\n/app\n", run
        assert run["verify"]["exit_code"] == 0 and run["verify"]["output"] == "v\n", run
    finally:
        shutil.rmtree(top)


def test_a_multi_platform_index_gives_this_machines_image(tmp_path):
    """An index listing another platform first and this machine's second: this machine's."""
    import json
    import platform

    arch = _oci.ARCHES.get(platform.machine(), platform.machine())
    other = oci_layout(tmp_path / "other", [layer(("which", "file", "other"))], config())
    ours = oci_layout(tmp_path / "ours", [layer(("which", "file", "ours"))], config(workdir="/o"))
    for blob in (other / "blobs/sha256").iterdir():
        shutil.copy(blob, ours / "blobs/sha256" / blob.name)
    (entry,) = json.loads((ours / "index.json").read_text())["manifests"]
    (foreign,) = json.loads((other / "index.json").read_text())["manifests"]
    foreign["platform"] = {"os": "linux", "architecture": "s390x" if arch != "s390x" else "riscv64"}
    entry["platform"] = {"os": "linux", "architecture": arch}
    (ours / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "manifests": [foreign, entry]})
    )
    image = _oci.unpack(ours, tmp_path / "cache")
    assert (image.rootfs / "which").read_text() == "ours" and image.workdir == "/o"


def test_an_image_without_path_gets_dockers_default(tmp_path):
    """The step environment in an image: docker's default PATH when the image sets none (not
    the runner's), the image's ENV under the job's env."""
    from claw_sandbox.backends.base import DEFAULT_PATH
    from claw_sandbox.records import Job

    image = _oci.unpack(oci_layout(tmp_path / "img", [_base()], config(env=["A=img", "B=img"])),
                        tmp_path / "cache")  # fmt: skip
    backend = make_backend("bwrap", image=image)
    j = Job.from_dict(job("e", env={"B": "job"}))
    env = backend.sandbox(j, tmp_path / "j").env()
    assert (env["PATH"], env["A"], env["B"]) == (DEFAULT_PATH, "img", "job")
