"""`claw-sandbox build`: a Dockerfile into an OCI image layout without a daemon (COPY, ENV,
WORKDIR, USER, ARG, CMD; RUN inside bwrap over the root being built), read back by `_oci`."""

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
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
    applets = ("sh", "mkdir", "echo", "rm", "cat", "chmod", "id", "ls", "printf")
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
