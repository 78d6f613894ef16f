"""Hostile OCI images: a layer that reaches for host files' modes, digests checked before a byte
of a layer is applied, and the per-image byte and file budget (sparse files kept sparse and
counted by their apparent size, many tiny files, a cache keyed by content only)."""

import json
import os
import stat
import time
from pathlib import Path

import pytest
from claw_sandbox import _oci
from claw_sandbox.cli import main
from claw_sandbox.errors import ImageError
from click.testing import CliRunner
from oci_testlib import config, docker_save, layer, oci_layout
from sandbox_testlib import job

GIB = 1 << 30


def _host(tmp_path: Path) -> Path:
    """Host paths a layer must never touch: a 0600 file, a 0700 directory, and a 0700 directory
    `b` (the name a nested entry of the layer uses)."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("s")
    (host / "secret").chmod(0o600)
    for name in ("private", "b"):
        (host / name).mkdir()
        (host / name).chmod(0o700)
    return host


def _modes(host: Path) -> dict[str, int]:
    """The mode of the host tree, its parent and everything in it."""
    paths = [host.parent, host, *host.rglob("*")]
    return {str(p): stat.S_IMODE(os.lstat(p).st_mode) for p in paths}


def _evil(host: Path, cache: Path) -> bytes:
    """Directories with wide modes, each replaced in the same layer by a symlink to a host path
    (absolute, relative from where the unpacker works, and a parent of a recorded directory)."""
    up = os.path.relpath(host / "secret", cache / ".unpack-x" / "rootfs")
    return layer(
        ("f", "dir", 0o777), ("f", "sym", str(host / "secret")),
        ("d", "dir", 0o1777), ("d", "sym", str(host / "private")),
        ("r", "dir", 0o777), ("r", "sym", up),
        ("n/b", "dir", 0o777), ("n", "sym", str(host)),
    )  # fmt: skip


def test_a_symlink_over_a_recorded_directory_changes_no_host_mode(tmp_path):
    """`d` (0777) then `d -> /host/path` in one layer: the image keeps the link, and no host
    file or directory changes its mode (the unpacker chmods through no-follow directory fds)."""
    host = _host(tmp_path)
    before = _modes(host)
    img = oci_layout(tmp_path / "img", [_evil(host, tmp_path / "cache")], config())
    image = _oci.unpack(img, tmp_path / "cache")
    assert _modes(host) == before
    assert os.readlink(image.rootfs / "f") == str(host / "secret")
    assert os.readlink(image.rootfs / "n") == str(host)


def test_run_oci_changes_no_host_mode(tmp_path, monkeypatch):
    """Through `claw-sandbox run --oci`: the image is unpacked (a cache entry with the links)
    before any job runs, and the host's modes stay as they were."""
    host = _host(tmp_path)
    before = _modes(host)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CLAW_SANDBOX_IMAGE_CACHE", str(cache))
    img = oci_layout(tmp_path / "img", [_evil(host, cache)], config())
    (tmp_path / "jobs.jsonl").write_text(json.dumps(job("j", command="true")) + "\n")
    args = [
        "run",
        str(tmp_path / "jobs.jsonl"),
        "--oci",
        str(img),
        "--workdir",
        str(tmp_path / "w"),
    ]
    CliRunner().invoke(main, args)  # the job may fail: the image has no shell
    assert _modes(host) == before
    (entry,) = os.listdir(cache)
    assert os.readlink(cache / entry / "rootfs" / "d") == str(host / "private")


def test_build_from_changes_no_host_mode(tmp_path):
    """`claw-sandbox build --from base=LAYOUT` unpacks the base the same way: host modes stay."""
    host = _host(tmp_path)
    before = _modes(host)
    work = tmp_path / "build"
    img = oci_layout(tmp_path / "img", [_evil(host, work)], config())
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM base\nENV A=1\n")
    args = ["build", str(ctx), "-o", str(tmp_path / "out"), "--from", f"base={img}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert _modes(host) == before


def test_a_layer_with_a_wrong_digest_is_refused_before_it_is_applied(tmp_path, monkeypatch):
    """A blob that does not match its manifest digest (or a docker save layer that does not match
    its config's diff_id) is refused with the layer's name, and not one member of it is applied."""
    host = _host(tmp_path)
    before = _modes(host)
    applied = []
    real = _oci._Layer.apply
    monkeypatch.setattr(_oci._Layer, "apply", lambda self, m, t: (applied.append(m.name), real(self, m, t)))  # fmt: skip
    evil = _evil(host, tmp_path / "cache")
    bad = oci_layout(tmp_path / "img", [evil], config(), bad_digest=True)
    with pytest.raises(
        ImageError, match=r"layer blobs/sha256/\w+: content does not match its digest"
    ):
        _oci.unpack(bad, tmp_path / "cache")
    lie = config(layers=[layer(("x", "file", "other"))])
    with pytest.raises(ImageError, match=r"layer \w+/layer.tar: .*does not match its diff_id"):
        _oci.unpack(docker_save(tmp_path / "lie.tar", [evil], lie), tmp_path / "cache")
    assert applied == [] and _modes(host) == before
    assert os.listdir(tmp_path / "cache") == []


def _holes_kept(where: Path) -> bool:
    probe = where / "probe"
    with open(probe, "wb") as f:
        f.truncate(1 << 20)
    kept = os.stat(probe).st_blocks == 0
    probe.unlink()
    return kept


def _sparse_layer() -> bytes:
    regions = [(4096, b"h" * 512), (GIB // 2, b"m" * 1024)]
    return layer(("big", "sparse", GIB, regions), ("after", "file", "x"), gz=True)


def test_a_sparse_member_stays_sparse(tmp_path):
    """A 1 GiB sparse member of a tiny layout unpacks to a 1 GiB file that takes a few KiB of disk,
    quickly, with its data where the map says."""
    if not _holes_kept(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem keeps no holes")
    img = oci_layout(tmp_path / "img", [_sparse_layer()], config(layers=[_sparse_layer()]))
    assert sum(p.stat().st_size for p in img.rglob("*") if p.is_file()) < 64 << 10
    started = time.monotonic()
    image = _oci.unpack(img, tmp_path / "cache")
    took = time.monotonic() - started
    st = os.stat(image.rootfs / "big")
    assert st.st_size == GIB and st.st_blocks * 512 < 1 << 20, st
    with open(image.rootfs / "big", "rb") as f:
        assert os.pread(f.fileno(), 4, 4096 - 2) == b"\0\0hh"
        assert os.pread(f.fileno(), 4, GIB // 2 + 1022) == b"mm\0\0"
        assert os.pread(f.fileno(), 4, GIB - 4) == b"\0" * 4
    assert (image.rootfs / "after").read_text() == "x"
    assert took < 5, took  # writing 1 GiB of zeros is what it must not do


def _forms(tmp_path: Path, layers: list[bytes], form: str) -> Path:
    """The image as an OCI layout (digests and diff_ids: checked before applying) or a `docker
    save` archive without diff_ids (nothing to check first: the budget holds while writing)."""
    if form == "oci":
        return oci_layout(tmp_path / "img", layers, config(layers=layers))
    return docker_save(tmp_path / "img.tar", layers, config())


FORMS = ["oci", "docker-save-without-diff-ids"]


@pytest.mark.parametrize("form", FORMS)
def test_a_sparse_member_over_the_byte_budget_is_refused(tmp_path, form):
    """The budget counts a sparse file by its apparent size: 1 GiB under a 512 MiB budget is
    refused, naming the layer and the member; nothing is left in the cache."""
    img = _forms(tmp_path, [_sparse_layer()], form)
    budget = _oci.Budget(max_bytes=512 << 20)
    with pytest.raises(
        ImageError, match=r"layer \S+: member 'big' .*over the image budget of 536870912 bytes"
    ):
        _oci.unpack(img, tmp_path / "cache", budget=budget)
    assert os.listdir(tmp_path / "cache") == []


@pytest.mark.parametrize("form", FORMS)
def test_the_byte_budget_counts_every_layer(tmp_path, form):
    """Two layers of 600 KiB under a 1 MiB budget: the second layer's member is refused by name;
    with 2 MiB both unpack."""
    layers = [
        layer(("a", "file-bytes", b"a" * (600 << 10))),
        layer(("b", "file-bytes", b"b" * (600 << 10))),
    ]
    img = _forms(tmp_path, layers, form)
    with pytest.raises(ImageError, match=r"member 'b' .*over the image budget of 1048576 bytes"):
        _oci.unpack(img, tmp_path / "cache", budget=_oci.Budget(max_bytes=1 << 20))
    image = _oci.unpack(img, tmp_path / "cache", budget=_oci.Budget(max_bytes=2 << 20))
    assert (image.rootfs / "b").stat().st_size == 600 << 10


@pytest.mark.parametrize("form", FORMS)
def test_many_tiny_files_hit_the_file_budget(tmp_path, form):
    """2,000 one-byte files under a 1,000-entry budget: refused by name at the 1,001st entry
    (while writing, the implied parent directory `d` is one; the check before writing counts
    members only)."""
    files = [(f"d/f{i:04d}", "file", "x") for i in range(2000)]
    img = _forms(tmp_path, [layer(*files)], form)
    with pytest.raises(
        ImageError, match=r"member 'd/f(0999|1000)'.*over the image budget of 1000 files"
    ):
        _oci.unpack(img, tmp_path / "cache", budget=_oci.Budget(max_files=1000))
    image = _oci.unpack(img, tmp_path / "cache", budget=_oci.Budget(max_files=2001))
    assert len(os.listdir(image.rootfs / "d")) == 2000


def test_a_cached_image_is_checked_against_the_budget(tmp_path):
    """An image already in the cache is not handed out under a budget it exceeds."""
    files = [(f"f{i}", "file", "x") for i in range(10)]
    img = oci_layout(tmp_path / "img", [layer(*files)], config())
    _oci.unpack(img, tmp_path / "cache")
    with pytest.raises(ImageError, match="cached image .* over the image budget of 5 files"):
        _oci.unpack(img, tmp_path / "cache", budget=_oci.Budget(max_files=5))


def test_a_huge_pax_header_is_refused(tmp_path):
    """A member whose pax header is 2 MiB (read into memory by a naive reader) is refused."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("x")
        info.pax_headers = {"comment": "c" * (2 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    img = docker_save(tmp_path / "img.tar", [buf.getvalue()], config())
    with pytest.raises(ImageError, match="header of .* bytes"):
        _oci.unpack(img, tmp_path / "cache")


def test_archives_without_diff_ids_are_cached_by_content(tmp_path):
    """Two `docker save` archives with one config (no diff_ids) and the same layer names but
    different layers get different cache entries, each with its own content."""
    names = ["0" * 64 + "/layer.tar"]
    a = docker_save(tmp_path / "a.tar", [layer(("which", "file", "a"))], config(), names=names)
    b = docker_save(tmp_path / "b.tar", [layer(("which", "file", "b"))], config(), names=names)
    first = _oci.unpack(a, tmp_path / "cache")
    second = _oci.unpack(b, tmp_path / "cache")
    assert (first.rootfs / "which").read_text() == "a"
    assert (second.rootfs / "which").read_text() == "b" and second.rootfs != first.rootfs


def test_whiteouts_and_replacements_of_recorded_directories(tmp_path):
    """A directory recorded for its mode and then whited out, replaced by a file, or cut off by
    a file in place of its parent, in the same layer: no raw OSError, and the replacing file
    keeps its own mode (not the directory's)."""
    top = layer(
        ("x", "dir", 0o700), ("x/y", "file", "y"), (".wh.x", "file", ""),
        ("d", "dir", 0o777), ("d", "file", "now a file", 0o600),
        ("p/q", "dir", 0o777), ("p", "file", "p", 0o640),
    )  # fmt: skip
    image = _oci.unpack(oci_layout(tmp_path / "img", [top], config()), tmp_path / "cache")
    root = image.rootfs
    assert not (root / "x").exists()
    assert (root / "d").read_text() == "now a file" and stat.S_IMODE(
        (root / "d").stat().st_mode
    ) == 0o600
    assert (root / "p").is_file() and stat.S_IMODE((root / "p").stat().st_mode) == 0o640


def test_cli_budget_flags(tmp_path, monkeypatch):
    """`run --oci --image-max-files` and `build --from --image-max-bytes` refuse an image over
    the budget with the layer and member named; sizes take K/M/G suffixes."""
    monkeypatch.setenv("CLAW_SANDBOX_IMAGE_CACHE", str(tmp_path / "cache"))
    files = [(f"f{i:02d}", "file", "x" * 1000) for i in range(50)]
    img = oci_layout(tmp_path / "img", [layer(*files)], config())
    (tmp_path / "jobs.jsonl").write_text(json.dumps(job("j")) + "\n")
    run = ["run", str(tmp_path / "jobs.jsonl"), "--oci", str(img), "--image-max-files", "10"]
    result = CliRunner().invoke(main, run)
    assert result.exit_code != 0 and "member 'f10'" in result.output, result.output
    assert "over the image budget of 10 files" in result.output
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM base\n")
    build = ["build", str(ctx), "-o", str(tmp_path / "out"), "--from", f"base={img}"]
    result = CliRunner().invoke(main, [*build, "--image-max-bytes", "20K"])
    assert result.exit_code != 0 and "over the image budget of 20480 bytes" in result.output, (
        result.output
    )
    result = CliRunner().invoke(main, [*build, "--image-max-bytes", "1M"])
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(main, [*build, "--image-max-bytes", "lots"])
    assert bad.exit_code == 2 and "--image-max-bytes" in bad.output
