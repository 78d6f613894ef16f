"""`claw-sandbox build`: a Dockerfile into an OCI image layout without a daemon (COPY, ENV,
WORKDIR, USER, ARG, CMD; RUN inside bwrap over the root being built), read back by `_oci`."""

import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from claw_sandbox import BuildError, _oci, build_image, run_jobs
from claw_sandbox.backends import make_backend
from oci_testlib import config, layer, oci_layout
from sandbox_testlib import job

BWRAP = make_backend("bwrap").unavailable()


def _blob(layout: Path, digest: str) -> bytes:
    data = (layout / "blobs/sha256" / digest.split(":")[1]).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest  # every blob named by content
    return data


def _read(layout: Path) -> tuple[dict, dict, list[list[str]]]:
    """(manifest, config, each layer's member names), checking digests, sizes and diff_ids."""
    (desc,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest = json.loads(_blob(layout, desc["digest"]))
    cfg = json.loads(_blob(layout, manifest["config"]["digest"]))
    names = []
    for i, d in enumerate(manifest["layers"]):
        data = _blob(layout, d["digest"])
        assert d["size"] == len(data) and d["mediaType"].endswith("tar+gzip")
        plain = gzip.decompress(data)
        assert cfg["rootfs"]["diff_ids"][i] == "sha256:" + hashlib.sha256(plain).hexdigest()
        with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
            names.append(tar.getnames())
    return manifest, cfg, names


def _context(top: Path, dockerfile: str) -> Path:
    ctx = top / "ctx"
    (ctx / "tool").mkdir(parents=True)
    (ctx / "tool" / "mytool").write_text("#!/bin/sh\necho tool\n")
    (ctx / "tool" / "mytool").chmod(0o755)
    (ctx / "passwd").write_text("root:x:0:0::/root:/bin/sh\ntool:x:1234:1234::/home/t:/bin/sh\n")
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


def test_copy_env_workdir_user_from_scratch(tmp_path):
    """FROM scratch: each COPY and the WORKDIR a layer, ENV/USER/CMD/ARG in the config; the
    layout unpacks with `_oci` into the files, env, workdir and user the Dockerfile says."""
    ctx = _context(tmp_path, (
        "FROM scratch\nARG DIR=/opt/tool\n"
        "COPY passwd /etc/passwd\n"
        "COPY --chmod=750 tool/ ${DIR}/bin/\n"
        'ENV PATH="${DIR}/bin:/bin" \\\n    MODE=test\n'
        "WORKDIR /app\nUSER tool\nCMD [\"mytool\"]\n"
    ))  # fmt: skip
    built = build_image(ctx, tmp_path / "img", tag="t:1", build_args={"DIR": "/opt/t"})
    manifest, cfg, names = _read(built.layout)
    assert names == [["etc", "etc/passwd"], ["opt", "opt/t", "opt/t/bin", "opt/t/bin/mytool"],
                     ["app"]]  # fmt: skip
    assert cfg["config"] == {"Env": ["PATH=/opt/t/bin:/bin", "MODE=test"], "WorkingDir": "/app",
                             "User": "tool", "Cmd": ["mytool"]}  # fmt: skip
    assert [h["empty_layer"] for h in cfg["history"]] == [True, True, False, False, True, False,
                                                          True, True]  # fmt: skip
    assert built.manifest_digest == json.loads((built.layout / "index.json").read_text())[
        "manifests"][0]["digest"]  # fmt: skip
    image = _oci.unpack(built.layout, tmp_path / "cache")
    tool = image.rootfs / "opt/t/bin/mytool"
    assert tool.read_text() == "#!/bin/sh\necho tool\n" and tool.stat().st_mode & 0o777 == 0o750
    assert (image.env["PATH"], image.workdir, image.user) == ("/opt/t/bin:/bin", "/app", "tool")
    assert _oci.resolve_user(image.rootfs, image.user) == (1234, 1234)


def test_bad_dockerfiles_name_the_line(tmp_path):
    """Unsupported instructions, a second FROM, an unknown base, a source outside the context
    and a failing RUN are errors naming the Dockerfile's line; the output is not left behind."""
    cases = [
        ('FROM scratch\nSHELL ["/bin/bash"]\n', r"Dockerfile:2: SHELL is not supported"),
        ("FROM scratch\nFROM scratch\n", r"Dockerfile:2: a second FROM"),
        ("FROM ubuntu:24.04\n", r"Dockerfile:1: FROM: no local image for 'ubuntu:24.04'"),
        ("FROM scratch\nCOPY ../x /x\n", r"Dockerfile:2: COPY: \.\./x: not a file or folder"),
        ("FROM scratch\nCOPY --from=b /x /x\n", r"Dockerfile:2: COPY: .*--from is not supported"),
        ("FROM scratch\nENV A\n", r"Dockerfile:2: ENV: expected KEY=VALUE"),
        ("COPY a b\n", r"the first instruction must be FROM"),
    ]
    for text, match in cases:
        ctx = _context(tmp_path / f"c{cases.index((text, match))}", text)
        with pytest.raises(BuildError, match=match):
            build_image(ctx, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def _busybox_image(top: Path) -> Path:
    """A base layout: a static busybox as /bin/busybox with its applets linked in /bin."""
    busybox = shutil.which("busybox")
    if busybox is None or b"ld-linux" in Path(busybox).read_bytes()[:4096]:
        pytest.skip("a static busybox is needed for a base image with a shell")
    applets = (
        "sh",
        "mkdir",
        "echo",
        "rm",
        "cat",
        "chmod",
        "id",
        "ls",
        "printf",
        "cp",
        "grep",
        "awk",
        "sleep",
        "touch",
        "[",
        "unshare",
    )
    base = layer(("bin", "dir"), ("bin/busybox", "file-bytes", Path(busybox).read_bytes(), 0o755),
                 *((f"bin/{a}", "sym", "busybox") for a in applets), ("etc", "dir"),
                 ("etc/passwd", "file", "root:x:0:0::/root:/bin/sh\ntool:x:1234:1234::/:/bin/sh\n"),
                 ("etc/old", "file", "gone\n"), gz=True)  # fmt: skip
    return oci_layout(top / "base", [base], config(env=["PATH=/bin"]))


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_run_steps_run_in_bwrap_over_the_image_being_built():
    """RUN runs inside the root being built (FROM a local layout, --from): what it writes is the
    next layer, what it removes a whiteout, USER's uid runs it; the job then runs in the image."""
    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-build-"))
    try:
        os.chmod(top, 0o755)
        base = _busybox_image(top)
        ctx = _context(top, (
            "FROM example.org/bb:1\nENV GREETING=hi\n"
            "RUN mkdir -p /opt/tool/bin /tmp && chmod 1777 /tmp && echo \"$GREETING\" > /etc/greeting && rm /etc/old\n"
            "COPY tool/mytool /opt/tool/bin/\nUSER tool\nRUN id -u > /tmp/built-by\n"
            "ENV PATH=/opt/tool/bin:/bin\nWORKDIR /work\n"
        ))  # fmt: skip
        built = build_image(ctx, top / "img", bases={"example.org/bb:1": base})
        _, cfg, names = _read(built.layout)
        assert len(names) == 5 and "etc/.wh.old" in names[1] and "etc/greeting" in names[1]
        assert "tmp/built-by" in names[3] and cfg["config"]["Env"][0] == "PATH=/opt/tool/bin:/bin"
        image = _oci.unpack(built.layout, top / "cache")
        assert (image.rootfs / "etc/greeting").read_text() == "hi\n"
        assert (image.rootfs / "tmp/built-by").read_text() == "1234\n"
        assert not (image.rootfs / "etc/old").exists()
        j = job("b", command="mytool && id -u && pwd && cat /etc/greeting")
        (run,) = run_jobs([j], backend=make_backend("bwrap", image=image), workdir=top / "jobs")
        assert run["stdout_tail"] == "tool\n1234\n/work\nhi\n", run
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_a_failing_run_step_is_an_error_with_its_output(tmp_path):
    """A RUN that exits non-zero stops the build: its line, exit status and output."""
    ctx = _context(tmp_path, "FROM scratch\nCOPY tool/mytool /bin/x\nRUN /bin/x && false\n")
    with pytest.raises(BuildError, match=r"Dockerfile:3: RUN: exited"):
        build_image(ctx, tmp_path / "img")
    assert not (tmp_path / "img").exists()


# --- hostile: a RUN step is never host root ---


def _hostile_top(monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 0755 directory under the system temp dir that the build's work dir is made in (so the
    test can watch it from the host), as root (the case where host root is at stake)."""
    if os.geteuid() != 0:
        pytest.skip("run as root: the build must not keep host root")
    top = Path(tempfile.mkdtemp(prefix="claw-sandbox-test-build-"))
    os.chmod(top, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(top))
    return top


def _layer_members(layout: Path) -> list[list[tarfile.TarInfo]]:
    manifest, _, _ = _read(layout)
    out = []
    for d in manifest["layers"]:
        plain = gzip.decompress(_blob(layout, d["digest"]))
        with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
            out.append(tar.getmembers())
    return out


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_a_setuid_run_step_makes_no_host_root_file(monkeypatch):
    """Hostile: a RUN copies a binary, `chmod 4755`s it and the COPYd one, then waits. Seen from
    the host meanwhile: the build's work dir is 0700 and what the RUN made belongs to an
    unprivileged uid, never root (a setuid-root file there gave any local user euid 0); by the
    next step no file of the root has an s-bit; the layer has none and gives the files to uid 0."""
    top = _hostile_top(monkeypatch)
    try:
        base = _busybox_image(top)
        ctx = _context(top, (
            "FROM bb\nCOPY tool/mytool /opt/x\n"
            "RUN cp /bin/busybox /opt/suid && chmod 4755 /opt/suid /opt/x && touch /opt/ready && "
            "i=0; while [ ! -e /opt/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
            "rm -f /opt/ready /opt/go\n"
            "ENV DONE=1\n"
        ))  # fmt: skip
        after: list[os.stat_result] = []

        def work() -> Path:
            (found,) = top.glob("claw-sandbox-build-*")
            return found

        def progress(line: str) -> None:
            if "ENV DONE=1" in line:  # the RUN is over, its layer applied
                after.extend(os.lstat(work() / "rootfs/opt" / n) for n in ("suid", "x"))

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(
                build_image, ctx, top / "img", bases={"bb": base}, progress=progress
            )
            seen: dict[str, os.stat_result] = {}
            try:
                deadline = time.monotonic() + 60
                while not seen and time.monotonic() < deadline and not future.done():
                    ready = list(top.glob("claw-sandbox-build-*/rootfs/opt/ready"))
                    if ready:
                        rootfs = ready[0].parent.parent
                        seen = {n: os.lstat(rootfs / "opt" / n) for n in ("suid", "x", "ready")}
                        seen["work"] = os.stat(rootfs.parent)
                    time.sleep(0.05)
            finally:
                for go in top.glob("claw-sandbox-build-*/rootfs/opt"):
                    (go / "go").touch()
            built = future.result(timeout=120)
        assert seen, "the RUN step never got to its wait"
        assert stat.S_IMODE(seen["work"].st_mode) == 0o700, oct(seen["work"].st_mode)
        for name in ("suid", "x", "ready"):  # made or changed by the RUN: not host root's
            st = seen[name]
            assert st.st_uid != 0 and st.st_gid != 0, (name, st.st_uid, st.st_gid)
        assert seen["suid"].st_uid == seen["ready"].st_uid == seen["work"].st_uid
        assert len(after) == 2
        for st in after:
            assert st.st_uid != 0 and not st.st_mode & (stat.S_ISUID | stat.S_ISGID), st
        run = {m.name: m for m in _layer_members(built.layout)[2]}
        assert {"opt/suid", "opt/x"} <= set(run)
        for name in ("opt/suid", "opt/x"):
            assert (run[name].mode, run[name].uid, run[name].gid) == (0o755, 0, 0), run[name]
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_a_run_step_is_namespace_root_without_capabilities(monkeypatch):
    """Hostile: a RUN records what it is: uid 0 inside (namespace root, kept for builds that
    expect it), but no capability (effective and bounding sets empty), no_new_privs, the job's
    seccomp filter (a new user namespace is refused), its root mounted nosuid; writing a
    host-wide sysctl (vm.swappiness, its own value back) is refused, so nothing outside its
    root can be written."""
    top = _hostile_top(monkeypatch)
    try:
        base = _busybox_image(top)
        ctx = _context(top, (
            "FROM bb\n"
            "RUN mkdir /out && id -u > /out/uid && "
            "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status > /out/status && "
            "awk '$5 == \"/\" {print $6}' /proc/self/mountinfo > /out/root-mount && "
            "(unshare -U true 2>/dev/null && echo made || echo refused) > /out/userns && "
            "v=$(cat /proc/sys/vm/swappiness) && "
            "( (echo $v > /proc/sys/vm/swappiness) 2>/dev/null && echo wrote || echo refused ) "
            "> /out/sysctl\n"
        ))  # fmt: skip
        built = build_image(ctx, top / "img", bases={"bb": base})
        image = _oci.unpack(built.layout, top / "cache")
        out = {p.name: p.read_text() for p in (image.rootfs / "out").iterdir()}
        status = dict(line.split(":\t") for line in out["status"].splitlines())
        assert out["uid"] == "0\n"
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
        assert "nosuid" in out["root-mount"].split(","), out["root-mount"]
        assert out["userns"] == "refused\n"
        assert out["sysctl"] == "refused\n"
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_built_layers_carry_no_setuid_bits(monkeypatch):
    """Hostile: a context file with mode 6755, `COPY --chmod=4755`, and RUN steps that chmod
    files 4755/6755 (one the base image's): no member of any built layer is setuid, and none but
    a directory setgid; the modes are otherwise kept."""
    top = _hostile_top(monkeypatch)
    try:
        base = _busybox_image(top)
        ctx = _context(top, (
            "FROM bb\nCOPY tool/mytool /opt/a\nCOPY --chmod=4755 tool/mytool /opt/b\n"
            "RUN cp /bin/busybox /opt/c && chmod 6755 /opt/c /opt/a && chmod 4755 /bin/busybox "
            "&& mkdir -m 2775 /shared\n"
        ))  # fmt: skip
        (ctx / "tool/mytool").chmod(0o6755)
        built = build_image(ctx, top / "img", bases={"bb": base})
        members = [m for layer_ in _layer_members(built.layout)[1:] for m in layer_]
        modes = {m.name: m.mode for m in members}
        assert {"opt/a", "opt/b", "opt/c", "bin/busybox", "shared"} <= set(modes)
        for m in members:
            assert not m.mode & stat.S_ISUID, (m.name, oct(m.mode))
            assert m.isdir() or not m.mode & stat.S_ISGID, (m.name, oct(m.mode))
        assert modes["opt/c"] == modes["bin/busybox"] == 0o755 and modes["shared"] == 0o2775
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap unavailable: {BWRAP}")
def test_a_work_dir_the_build_uid_cannot_reach_is_a_clear_error(monkeypatch, tmp_path):
    """As root, a RUN runs as the unprivileged build uid: a temp dir under a 0700 parent (pytest's
    own) is refused before the step runs, naming the line, the parent and TMPDIR."""
    if os.geteuid() != 0:
        pytest.skip("run as root: only then does the build drop to another uid")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(closed))
    ctx = _context(tmp_path, "FROM scratch\nCOPY tool/mytool /bin/x\nRUN /bin/x\n")
    with pytest.raises(BuildError, match=r"Dockerfile:3: RUN: runs as uid \d+, which cannot "
                       r"reach the build's work dir under (\S+) \(mode 700\): set TMPDIR") as exc:  # fmt: skip
        build_image(ctx, tmp_path / "img")
    assert closed.is_relative_to(exc.value.args[0].split(" under ")[1].split(" (mode")[0])
    assert not (tmp_path / "img").exists() and not any(closed.iterdir())
