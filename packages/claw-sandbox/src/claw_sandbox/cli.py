"""The `claw-sandbox` command line: a thin click group over the library."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from claw_sandbox import __version__, _oci
from claw_sandbox.backends import BACKENDS, doctor, get_backend
from claw_sandbox.errors import ClawError
from claw_sandbox.records import JOB_SCHEMA, Job, read_jobs
from claw_sandbox.scheduler import Scheduler


def _log(msg: str) -> None:
    click.echo(f"claw-sandbox: {msg}", err=True)


def _backend(
    name: str, ro_paths: tuple[str, ...], image: str | None = None, rootfs: str | None = None,
    oci: tuple[str, ...] = (), budget: _oci.Budget | None = None,
):  # fmt: skip
    options: dict = {"ro_paths": ro_paths} if ro_paths and name in ("auto", "bwrap") else {}
    if rootfs and name in ("auto", "bwrap"):
        options["rootfs"] = rootfs
    if name == "docker" and image:
        options["default_image"] = image
    try:
        if oci:  # only bwrap runs an unpacked image: no fallback to the host's root
            if name not in ("auto", "bwrap") or rootfs:
                raise click.UsageError("--oci needs the bwrap backend and no --rootfs")
            name = "bwrap"
            options.update(_images(oci, budget))
        return get_backend(name, **options)
    except ClawError as exc:
        raise click.ClickException(
            f"{exc}\nhint: `claw-sandbox doctor` shows what works here"
        ) from None


def _images(values: tuple[str, ...], budget: _oci.Budget | None = None) -> dict:
    """--oci values as bwrap's options: PATH (every job's image), NAME=PATH (the jobs whose
    `image` is NAME), each unpacked (or found in the cache) now, within the budget."""
    options: dict = {"images": {}}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or os.path.exists(value):
            name, path = "", value
        if not os.path.exists(path):
            raise click.BadParameter(f"{value}: no such file or directory", param_hint="--oci")
        try:
            image = _oci.unpack(path, budget=budget)
        except ClawError as exc:
            over = "image budget" in str(exc)
            hint = "\nhint: --image-max-bytes / --image-max-files raise it" if over else ""
            raise click.ClickException(f"{exc}{hint}") from None
        _log(f"image {name or '(every job)'}: {image.digest[:19]}... unpacked at {image.rootfs}")
        if name:
            options["images"][name] = image
        elif "image" in options:
            raise click.BadParameter("give one --oci PATH without a NAME=", param_hint="--oci")
        else:
            options["image"] = image
    return options


def _workdir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--workdir as an absolute path (bwrap binds and job paths need one), if it can be made:
    one line and exit 2 before any work otherwise."""
    if value is None:
        return None
    path = Path(value).absolute()
    there = path
    while not there.exists():  # the nearest existing ancestor: where mkdir -p starts
        there = there.parent
    if not there.is_dir():
        raise click.BadParameter(
            f"{value}: cannot be made: {there} is not a directory", ctx=ctx, param=param
        )
    if not os.access(there, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: {there} is not writable", ctx=ctx, param=param)
    return str(path)


backend_option = click.option(
    "--backend", "-b", type=click.Choice(["auto", *BACKENDS]), default="auto", show_default=True,
    help="auto = bwrap where it works, else process (which does not isolate)",
)  # fmt: skip
image_option = click.option(
    "--image",
    default=None,
    help="docker backend: image for jobs that name none (else CLAW_SANDBOX_IMAGE)",
)


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A byte count: digits with an optional K, M, G or T (powers of 1024), e.g. 8G."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:I?B)?", value.strip().upper())
    if not m or int(m[1]) == 0:
        raise click.BadParameter(f"{value!r} is not a size such as 8G, 512M or 1048576")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2]]


max_bytes_option = click.option(
    "--image-max-bytes", default=f"{_oci.MAX_BYTES >> 30}G", show_default=True, metavar="SIZE",
    callback=_size,
    help="the most an OCI image may write when unpacked, all layers together: regular files by "
    "apparent size (a sparse file counts its holes); K, M, G, T suffixes",
)  # fmt: skip
max_files_option = click.option(
    "--image-max-files", default=_oci.MAX_FILES, show_default=True, type=click.IntRange(1),
    metavar="N", help="the most entries (files, directories, links) an OCI image may unpack to",
)  # fmt: skip
ro_option = click.option(
    "--ro-path", "ro_paths", multiple=True, metavar="DIR",
    help="host directory to show read-only inside bwrap sandboxes (repeatable), e.g. a venv under /home",
)  # fmt: skip


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-sandbox")
def main() -> None:
    """claw-sandbox: run claw.job/v1 records in throw-away sandboxes, write claw.run/v1 records."""


@main.command()
@click.argument("jobs", default="-", type=click.Path(allow_dash=True, dir_okay=False))
@click.option(
    "-o",
    "--output",
    "out",
    default="-",
    type=click.Path(allow_dash=True),
    help="runs JSONL; a file is appended to and resumed from (jobs already in it are skipped)",
)
@click.option(
    "--retry-errors",
    is_flag=True,
    help="run again the jobs whose run in --output ended in error or infra_error (e.g. after "
    "fixing their job lines); their old records are dropped from the file",
)
@backend_option
@click.option(
    "--parallel",
    "-p",
    default=4,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="jobs run at the same time",
)
@click.option(
    "--retries",
    default=2,
    show_default=True,
    type=click.IntRange(0, 100),
    help="extra attempts after an infrastructure failure, then status infra_error",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    callback=_workdir,
    help="where job directories are made (default: a fresh temp dir); a relative path is taken "
    "from the current directory",
)
@ro_option
@image_option
@click.option(
    "--rootfs",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    metavar="DIR",
    help="bwrap: this directory (e.g. an exported image) as the jobs' read-only root, not the host's "
    "(else CLAW_SANDBOX_ROOTFS)",
)
@click.option(
    "--oci",
    multiple=True,
    metavar="[NAME=]PATH",
    help="bwrap: run the jobs in this image, an OCI image layout directory or a `docker save` tar "
    "(unpacked once, cached by digest; its ENV, WORKDIR and USER apply); NAME=PATH: only the jobs "
    "whose `image` is NAME (repeatable)",
)
@max_bytes_option
@max_files_option
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: run the jobs as Ray tasks across the cluster (needs claw-sandbox[ray])",
)
@click.option(
    "--ray-address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a local Ray)"
)
def run(jobs, out, retry_errors, backend, parallel, retries, workdir, ro_paths, image, rootfs, oci,
        image_max_bytes, image_max_files, executor, ray_address) -> None:  # fmt: skip
    """Run every job of a claw.job/v1 JSONL file; stream claw.run/v1 lines as jobs finish.

    A bad line becomes a `status: error` run naming file, line and field; the other jobs run.
    Exits 1 when the file holds no valid job.

    Example:

        claw-sandbox run jobs.jsonl -o runs.jsonl --backend bwrap --parallel 8
    """
    _check_out(out)
    try:
        items = _read_jobs(jobs)
    except ClawError as exc:
        raise click.ClickException(str(exc)) from None
    _run(items, jobs, out, retry_errors, backend, parallel, retries, workdir, ro_paths, executor,
         ray_address, image=image, rootfs=rootfs, oci=oci,
         budget=_oci.Budget(max_bytes=image_max_bytes, max_files=image_max_files))  # fmt: skip
    if not any(isinstance(i, Job) for i in items):
        bad = len(items)
        raise click.ClickException(
            f"no valid job in {'stdin' if jobs == '-' else jobs}"
            + (f" ({bad} invalid line{'s' * (bad != 1)}, recorded as status error)" if bad else "")
        )


def _check_out(out: str) -> None:
    """The runs file must be `-` or a file in an existing directory: one line and exit 2 before
    any work otherwise."""
    if out == "-":
        return
    path = Path(out)
    problem = None
    if path.is_dir():
        problem = "is a directory; give a file, e.g. " + str(path / "runs.jsonl")
    elif not path.parent.is_dir():
        problem = f"directory {path.parent} does not exist"
    elif not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        problem = "is not writable"
    if problem:
        click.echo(f"Error: --output {out}: {problem}", err=True)
        sys.exit(2)


def _run(items, jobs, out, retry_errors, backend, parallel, retries, workdir, ro_paths, executor,
         ray_address, image=None, rootfs=None, oci=(), budget=None) -> None:  # fmt: skip
    if executor == "ray":
        if oci:
            raise click.UsageError("--oci runs with the local executor only")
        from claw_sandbox.ray_executor import run_on_ray

        started = time.monotonic()

        def show(row: dict) -> None:
            if out == "-":
                click.echo(json.dumps(row, ensure_ascii=False))

        try:
            rows = run_on_ray(items, backend=backend, out=None if out == "-" else out, retries=retries,
                              parallel=parallel, address=ray_address, log=_log, ro_paths=ro_paths,
                              on_run=show, retry_errors=retry_errors)  # fmt: skip
        except ClawError as exc:
            raise click.ClickException(str(exc)) from None
        counts = {
            s: sum(r["status"] == s for r in rows)
            for s in ("ok", "timeout", "error", "infra_error")
        }
        _log(
            f"ray: {len(rows)} jobs run: "
            + ", ".join(f"{v} {k}" for k, v in counts.items())
            + f"; {time.monotonic() - started:.2f}s"
        )
        return
    sched = Scheduler(
        _backend(backend, ro_paths, image, rootfs, oci, budget),
        parallel,
        retries,
        Path(workdir) if workdir else None,
        _log,
        retry_errors=retry_errors,
    )
    started = time.monotonic()
    try:
        asyncio.run(_drive(sched, items, None if out == "-" else out))
    except ClawError as exc:
        raise click.ClickException(str(exc)) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        _log(
            "interrupted: running sandboxes were killed and removed; rerun with the same -o to resume"
        )
        _log(sched.summary(time.monotonic() - started))
        sys.exit(130)
    _log(sched.summary(time.monotonic() - started))


def _read_jobs(path: str) -> list:
    if path == "-":
        return list(read_jobs(sys.stdin, "<stdin>"))
    p = Path(path)
    try:
        with p.open() as f:
            return list(read_jobs(f, str(p), base_dir=p.resolve().parent))
    except OSError as exc:
        raise ClawError(f"cannot read jobs file {path}: {exc.strerror}") from None


async def _drive(sched: Scheduler, items: list, out: str | None) -> None:
    # SIGTERM: cancel like Ctrl-C, so every sandbox is killed and its directory removed. A second
    # SIGTERM ends the runner at once (default action); the next run removes what is left.
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()

    def on_sigterm() -> None:
        if main_task is not None:
            main_task.cancel()
        loop.remove_signal_handler(signal.SIGTERM)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    progress = None
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress

        progress = Progress(
            console=Console(stderr=True), redirect_stdout=False, redirect_stderr=False
        )
    task: Any = None
    if progress is not None:
        progress.start()
        task = progress.add_task("jobs", total=None)
    try:
        async for row in sched.stream(items, out):
            if out is None:
                sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
                sys.stdout.flush()
            if progress is not None:
                progress.update(task, total=sched.total - sched.skipped, advance=1,
                                description=f"jobs ({sched.counts.get('ok', 0)} ok)")  # fmt: skip
    finally:
        if progress is not None:
            progress.stop()


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@backend_option
@click.option(
    "--timeout",
    "timeout_s",
    default=600.0,
    show_default=True,
    type=float,
    help="seconds before the command is killed (exit code 124)",
)
@click.option(
    "--network",
    type=click.Choice(["none", "proxy", "host"]),
    default="none",
    show_default=True,
    help="none: no network; proxy: only --proxy-url, seen inside on loopback --port; "
    "host: the host's network",
)
@click.option("--proxy-url", default=None, help="host-side proxy URL (network proxy)")
@click.option("--port", type=int, default=None, help="loopback port the proxy appears on inside")
@click.option(
    "--memory-mb", type=int, default=None, help="memory limit, MiB (default: the backend's)"
)
@click.option(
    "--pids", type=int, default=None, help="most processes/threads (default: the backend's)"
)
@click.option(
    "--cpus",
    type=float,
    default=None,
    help="CPU quota in CPUs, fractions allowed (default: the backend's)",
)
@click.option(
    "--copy-from", default=None, help="host directory or tarball to start the workspace from"
)
@click.option(
    "--env",
    "-e",
    "envs",
    multiple=True,
    metavar="KEY=VALUE",
    help="environment variable for the command (repeatable)",
)
@click.option("--keep", is_flag=True, help="keep the sandbox directory afterwards")
@click.option(
    "--json", "as_json", is_flag=True, help="print the claw.run/v1 record instead of the output"
)
@ro_option
@image_option
@click.argument("command", nargs=-1, required=True)
def exec_(backend, timeout_s, network, proxy_url, port, memory_mb, pids, cpus, copy_from, envs, keep,
          as_json, ro_paths, image, command) -> None:  # fmt: skip
    """Run one command in a fresh sandbox; exit with its exit code (124 on timeout).

    Example:

        claw-sandbox exec --backend bwrap --network none -- python3 -c 'print(1)'
    """
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    row = {
        "schema": JOB_SCHEMA, "job_id": "exec", "command": list(command), "env": env, "timeout_s": timeout_s,
        "limits": {k: v for k, v in (("memory_mb", memory_mb), ("pids", pids), ("cpus", cpus)) if v},
        "network": {k: v for k, v in (("policy", network), ("proxy_url", proxy_url), ("port", port)) if v},
        "keep": "always" if keep else "never",
    }  # fmt: skip
    if copy_from:
        row["workspace"] = {"copy_from": copy_from}
    try:
        job = Job.from_dict(row, "exec")
    except ClawError as exc:
        raise click.ClickException(str(exc)) from None
    sched = Scheduler(_backend(backend, ro_paths, image), 1, 0, None, _log)

    async def one() -> dict:
        return [r async for r in sched.stream([job])][0]

    result = asyncio.run(one())
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write(result["stdout_tail"])
        sys.stderr.write(result["stderr_tail"])
    if result["error"]:
        _log(result["error"])
    if result["status"] == "timeout":
        sys.exit(124)
    if result["status"] in ("error", "infra_error"):
        sys.exit(125)
    sys.exit(result["exit_code"] or 0)


@main.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.option(
    "--backend", "-b", type=click.Choice(["auto", *BACKENDS]), default="auto", show_default=True,
    help="the backend PROGRAMs are checked in",
)  # fmt: skip
@ro_option
@click.argument("programs", nargs=-1)
def doctor_(as_json, backend, ro_paths, programs) -> None:
    """Print which backends and facilities work on this machine, and why not; with PROGRAMs
    (e.g. a harness's executables), whether each is on PATH here and runs inside a sandbox as a
    job's command would find it (exit 1 when one does not).

    Example:

        claw-sandbox doctor
        claw-sandbox doctor --backend bwrap claude mini
    """
    from claw_sandbox._doctor import check_programs

    rows = doctor()
    if programs:
        rows += check_programs(_backend(backend, ro_paths), list(programs))
    for row in rows:
        if as_json:
            click.echo(json.dumps(row))
        else:
            mark = "ok " if row["works"] else "NO "
            click.echo(f"{mark} {row['name']:<8} {row['why']}")
    if any(not r["works"] for r in rows if r["kind"] == "program"):
        sys.exit(1)


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint=option)
        out[key] = value
    return out


@main.command(name="build")
@click.argument("context", type=click.Path(file_okay=False, exists=True))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    help="write the image here as an OCI image layout (a new or empty directory), the form "
    "`claw-sandbox run --oci` reads",
)
@click.option(
    "--file", "-f", "dockerfile", default=None, metavar="PATH",
    help="the Dockerfile (default: CONTEXT/Dockerfile)",
)  # fmt: skip
@click.option(
    "--from",
    "bases",
    multiple=True,
    metavar="NAME=PATH",
    help="the image a `FROM NAME` line starts from: a local OCI image layout or `docker save` "
    "tar (repeatable; `FROM scratch` needs none)",
)
@click.option("--build-arg", "build_args", multiple=True, metavar="NAME=VALUE",
              help="an ARG's value (repeatable)")  # fmt: skip
@max_bytes_option
@max_files_option
@click.option("--tag", "-t", default=None, help="the image's name, as index.json's ref.name")
@click.option(
    "--network", type=click.Choice(["none", "host"]), default="none", show_default=True,
    help="RUN steps' network: none, or the host's",
)  # fmt: skip
def build_(context, output, dockerfile, bases, build_args, image_max_bytes, image_max_files, tag,
           network) -> None:  # fmt: skip
    """Build a Dockerfile into an OCI image layout without a daemon: COPY/ADD from CONTEXT and
    ENV, WORKDIR, USER, ARG, CMD, ENTRYPOINT, LABEL, EXPOSE as Docker does; RUN inside bwrap over
    the root being built. One stage, FROM scratch or a local image (--from). Prints the
    manifest digest.

    Example:

        claw-sandbox build task/environment -o img --from ubuntu:24.04=ubuntu.tar
        claw-sandbox run jobs.jsonl --backend bwrap --oci img
    """
    from claw_sandbox._build import build

    try:
        built = build(
            context, output, dockerfile=dockerfile, bases=_pairs(bases, "--from"), tag=tag,
            build_args=_pairs(build_args, "--build-arg"), network=network == "host", progress=_log,
            image_budget=_oci.Budget(max_bytes=image_max_bytes, max_files=image_max_files),
        )  # fmt: skip
    except ClawError as exc:
        raise click.ClickException(str(exc)) from None
    _log(f"{built.layers} layers, config {built.config_digest[:19]}...: {built.layout}")
    click.echo(built.manifest_digest)
