"""Build OCI image layouts and `docker save` archives by hand (no daemon): layers as tar bytes."""

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path


def layer(*entries, gz: bool = False) -> bytes:
    """A layer tar from entries: (name, "file", text[, mode]), (name, "dir"[, mode]), (name,
    "sym", target), (name, "link", target), (name, "chr"), (name, "file-bytes", data[, mode]),
    (name, "sparse", size, [(offset, data), ...]): a GNU sparse (PAX 0.1) file of `size` bytes
    that stores only the data regions (each whole 512-byte blocks, as GNU tar writes them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, *rest in entries:
            info = tarfile.TarInfo(name)
            data = None
            if kind in ("file", "file-bytes"):
                data = rest[0].encode() if kind == "file" else rest[0]
                info.size, info.mode = len(data), rest[1] if len(rest) > 1 else 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, rest[0] if rest else 0o755
            elif kind == "sparse":
                size, regions = rest
                data = b"".join(chunk for _, chunk in regions)
                ends = [(off, len(chunk)) for off, chunk in regions] + [(size, 0)]  # as GNU tar
                spans = ",".join(f"{off},{n}" for off, n in ends)
                info.size, info.mode = len(data), 0o644
                info.pax_headers = {"GNU.sparse.size": str(size),  # in GNU tar's order
                                    "GNU.sparse.numblocks": str(len(ends)),
                                    "GNU.sparse.name": name, "GNU.sparse.map": spans}  # fmt: skip
            elif kind in ("sym", "link"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = rest[0]
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw) if gz else raw


def config(env=(), workdir="", user="", layers=None) -> bytes:
    """An image config; with `layers`, rootfs.diff_ids (their uncompressed digests) as a
    built image's config has."""
    cfg = {"Env": list(env), "WorkingDir": workdir, "User": user}
    out = {"architecture": "amd64", "os": "linux", "config": cfg}
    if layers is not None:
        ids = [_sha(gzip.decompress(b) if b[:2] == b"\x1f\x8b" else b) for b in layers]
        out["rootfs"] = {"type": "layers", "diff_ids": ids}
    return json.dumps(out).encode()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_layout(root: Path, layers: list[bytes], cfg: bytes, *, bad_digest: bool = False) -> Path:
    """An OCI image layout directory: oci-layout, index.json -> manifest -> config + layers."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    descs = []
    for data in layers:
        digest = put(data)
        if bad_digest:  # the manifest names another digest than the blob's content
            (blobs / digest.split(":")[1]).write_bytes(data + b"\0" * 1024)
        gz = data[:2] == b"\x1f\x8b"
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else "")
        descs.append({"mediaType": media, "digest": digest, "size": len(data)})
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(cfg), "size": len(cfg)},
        "layers": descs,
    }  # fmt: skip
    data = json.dumps(manifest).encode()
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": manifest["mediaType"], "digest": put(data), "size": len(data)}]}  # fmt: skip
    (root / "index.json").write_text(json.dumps(index))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def docker_save(
    path: Path, layers: list[bytes], cfg: bytes, names: list[str] | None = None
) -> Path:
    """A `docker save` archive: manifest.json naming <config>.json and <id>/layer.tar files
    (or the layer names given)."""
    files = {f"{_sha(cfg)[7:]}.json": cfg}
    names = names or [f"{_sha(data)[7:]}/layer.tar" for data in layers]
    for name, data in zip(names, layers, strict=True):
        files[name] = data
    manifest = [{"Config": f"{_sha(cfg)[7:]}.json", "RepoTags": ["t:latest"], "Layers": names}]
    files["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
