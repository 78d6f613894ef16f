"""Datasets by name (``claw-bench plan -d terminal-bench@2.0``), resolved from a registry in
Harbor's format and cached.

A registry is a JSON list of datasets (Harbor's ``registry.json``)::

    [{"name": "terminal-bench", "version": "2.0", "description": "...",
      "tasks": [{"name": "hello-world", "git_url": "https://github.com/org/repo.git",
                 "git_commit_id": "7c1e...", "path": "tasks/hello-world"}, ...]}, ...]

A task with a ``git_url`` is the folder ``path`` of that repository at ``git_commit_id`` (the
remote's HEAD when null or ``"head"``); a task without one is a local folder, ``path`` relative to
the registry file. The registry is a local file or an http(s) URL.

The cache (``$CLAW_BENCH_CACHE``, else ``$XDG_CACHE_HOME/claw-bench``, else
``~/.cache/claw-bench``) holds one checkout per (repository, commit) under ``git/`` and, under
``datasets/<name>@<version>-<key>/``, one link per task to its folder, where ``<key>`` hashes the
dataset's task list (names, repositories, commits, paths): an edited registry entry gives a new
directory, an unchanged one is reused without touching the network. That directory is a suite
(``load_suite``) like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from claw_bench.errors import TaskError


def cache_dir() -> Path:
    """The cache root: $CLAW_BENCH_CACHE, else $XDG_CACHE_HOME/claw-bench, else ~/.cache/claw-bench."""
    if os.environ.get("CLAW_BENCH_CACHE"):
        return Path(os.environ["CLAW_BENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "claw-bench"


def read_registry(registry: str) -> tuple[list[dict[str, Any]], Path | None]:
    """(the registry's datasets, the folder local task paths are relative to: the registry
    file's, None for a URL). TaskError names the registry and what is wrong."""
    if registry.startswith(("http://", "https://")):
        import httpx

        try:
            resp = httpx.get(registry, timeout=60, follow_redirects=True)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise TaskError(f"registry {registry}: cannot fetch it: {exc}") from None
        text, base = resp.text, None
    else:
        path = Path(registry.removeprefix("file://"))
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TaskError(f"registry {registry}: cannot read it: {exc.strerror}") from None
        base = path.resolve().parent
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(f"registry {registry}: not JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise TaskError(f"registry {registry}: expected a JSON list of datasets (Harbor's format)")
    return data, base


def find_dataset(datasets: list[dict[str, Any]], spec: str, registry: str) -> dict[str, Any]:
    """The dataset ``NAME@VERSION`` (or ``NAME`` when the registry has one version of it)."""
    name, _, version = spec.partition("@")
    same = [d for d in datasets if d.get("name") == name]
    versions = [str(d.get("version")) for d in same]
    if not same:
        names = sorted({str(d.get("name")) for d in datasets})
        raise TaskError(f"registry {registry}: no dataset {name!r} (it has: {', '.join(names)})")
    if not version and len(same) == 1:
        return same[0]
    if not version:
        raise TaskError(f"dataset {name}: give a version, NAME@VERSION (one of {versions})")
    found = [d for d in same if str(d.get("version")) == version]
    if not found:
        raise TaskError(
            f"registry {registry}: dataset {name} has no version {version!r} ({versions})"
        )
    return found[0]


def _task_entries(ds: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The dataset's tasks, checked: a name, a relative path without '..', git fields as strings."""
    tasks = ds.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise TaskError(f"{where}: field tasks must be a non-empty list")
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise TaskError(f"{where}: tasks[{i}]: needs a name")
        path = t.get("path")
        if not isinstance(path, str) or not path:
            raise TaskError(f"{where}: tasks[{i}] ({t['name']}): field path must be a string")
        if t.get("git_url") is not None and (
            PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts
        ):
            raise TaskError(
                f"{where}: tasks[{i}] ({t['name']}): path {path!r} leaves the repository"
            )
        for key in ("git_url", "git_commit_id"):
            if t.get(key) is not None and not isinstance(t[key], str):
                raise TaskError(f"{where}: tasks[{i}] ({t['name']}): field {key} must be a string")
    return tasks


def _git(args: list[str], where: str) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TaskError(f"{where}: git {' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def _commit(url: str, commit: str | None, where: str) -> str:
    """``commit``, or the remote's HEAD when it is null or ``head``."""
    if commit and commit.lower() != "head":
        return commit
    out = _git(["ls-remote", url, "HEAD"], where).split()
    if not out:
        raise TaskError(f"{where}: {url} has no HEAD")
    return out[0]


def checkout(url: str, commit: str, root: Path, where: str) -> Path:
    """The cached checkout of ``url`` at ``commit`` (made once: fetched into a temporary folder,
    then renamed into place, so an interrupted fetch never leaves a half checkout)."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    dest = root / "git" / f"{key}-{commit}"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest.parent))
    try:
        _git(["init", "-q", str(tmp)], where)
        try:  # just the commit, when the server allows it
            _git(["-C", str(tmp), "fetch", "-q", "--depth", "1", url, commit], where)
        except TaskError:
            _git(["-C", str(tmp), "fetch", "-q", url, "+refs/heads/*:refs/remotes/origin/*"], where)
        _git(["-C", str(tmp), "-c", "advice.detachedHead=false", "checkout", "-q", commit], where)
        shutil.rmtree(tmp / ".git")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve_dataset(spec: str, registry: str, root: Path | None = None) -> Path:
    """The suite directory of dataset ``spec`` (``NAME@VERSION``) from ``registry`` (a path or
    URL in Harbor's registry format), fetched into the cache ``root`` (:func:`cache_dir`) when
    not there yet. TaskError names the registry, dataset and task entry that is wrong."""
    root = root or cache_dir()
    datasets, base = read_registry(registry)
    ds = find_dataset(datasets, spec, registry)
    where = f"registry {registry}: dataset {ds.get('name')}@{ds.get('version')}"
    tasks = _task_entries(ds, where)
    links = [_link_name(t["name"]) for t in tasks]
    if len(set(links)) != len(links):
        dup = next(n for n in links if links.count(n) > 1)
        raise TaskError(f"{where}: task name {dup!r} appears more than once")
    resolved = []
    for t in tasks:
        url = t.get("git_url")
        commit = _commit(url, t.get("git_commit_id"), f"{where}: {t['name']}") if url else None
        resolved.append({"name": t["name"], "git_url": url, "commit": commit, "path": t["path"]})
    keyed = {"tasks": resolved, "base": str(base) if base else None}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    suite = root / "datasets" / f"{ds['name']}@{ds.get('version')}-{key}"
    if suite.is_dir():
        return suite
    tmp = Path(tempfile.mkdtemp(prefix=".suite-", dir=_made(suite.parent)))
    try:
        for t in resolved:
            folder = _task_folder(t, base, root, f"{where}: {t['name']}")
            (tmp / _link_name(t["name"])).symlink_to(folder, target_is_directory=True)
        os.replace(tmp, suite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return suite


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _link_name(name: str) -> str:
    """A task's link name in the suite folder (a registry name such as org/task is flattened)."""
    return name.replace("/", "__").lstrip(".") or "task"


def _task_folder(t: dict[str, Any], base: Path | None, root: Path, where: str) -> Path:
    """A task's folder: in its repository's cached checkout, or local (relative to ``base``)."""
    if t["git_url"]:
        folder = checkout(t["git_url"], t["commit"], root, where) / t["path"]
    elif base is None and not Path(t["path"]).is_absolute():
        raise TaskError(
            f"{where}: a task without git_url in a registry fetched by URL needs an absolute path"
        )
    else:
        folder = (base or Path("/")) / t["path"]
    if not folder.is_dir():
        raise TaskError(
            f"{where}: {t['path']} is not a folder"
            + (f" of {t['git_url']}@{t['commit']}" if t["git_url"] else "")
        )
    return folder.resolve()
