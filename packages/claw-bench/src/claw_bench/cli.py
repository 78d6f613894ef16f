"""The `claw-bench` command line: a thin click group over the library."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import TYPE_CHECKING, Any

import click

from claw_bench._choices import EXECUTORS, GROUP_BY, JUDGE_APIS, NETWORKS
from claw_bench._cli_paths import output_path
from claw_bench.errors import ClawError

if TYPE_CHECKING:
    from claw_bench.harnesses import Harness
    from claw_bench.loaders import LoadOptions
    from claw_bench.suites import Suite
    from claw_bench.tasks import Task

# Each command imports the library modules it calls (numpy, httpx, attrs, the loaders) when it
# runs, so `claw-bench --help` and a command's --help import only click.


def _output(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``-o/--output`` option every data command has: a JSONL file, ``-`` for stdout, checked
    while the command line is parsed."""
    return click.option(
        "-o", "--output", default="-", show_default=True, callback=output_path, help=help
    )


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ClawError as exc:
            raise click.ClickException(
                f"{exc}\nHint: see `claw-bench {fn.__name__.rstrip('_')} --help`."
            ) from exc

    return wrapper


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="claw-bench", prog_name="claw-bench")
def main() -> None:
    """claw-bench: tasks, harness adapters, job planning, scoring and Pass@k reports.

    See `claw-bench COMMAND --help`.
    """


_STRICT_HELP = (
    "a task of the suite that does not load, or cannot run here (e.g. a Harbor task with compose "
    "sidecars), is an error (default: skip it with a warning; plan makes a not_scorable job)"
)


def _suite(
    suite: str, options: LoadOptions | None = None, strict: bool = False, backend: str | None = None
) -> Suite:
    """load_suite, with one warning line per skipped task (its path and the reason) and per task
    that cannot run on `backend`."""
    from claw_bench.harbor import unsupported_reason
    from claw_bench.suites import load_suite

    s = load_suite(suite, options, strict=strict, backend=backend)
    for path, reason in s.skipped:
        _log(f"warning: skipped {path}: {' '.join(reason.split())}")
    for t in s.tasks:
        if (why := unsupported_reason(t.meta, backend)) is not None:
            _log(f"warning: task {t.id} will not run (not_scorable): {why}")
    return s


@main.command()
@click.option(
    "--suite", "-s", default="claw-mini", show_default=True, help="built-in suite name or directory"
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per task instead of a table")
@click.option("--strict", is_flag=True, help=_STRICT_HELP)
@_errors
def tasks(suite: str, as_json: bool, strict: bool) -> None:
    """List the tasks of a suite (built-in suites are listed at the end).

    A task that does not load is skipped with one warning line naming it and the reason
    (--strict: an error); the last line says how many loaded and how many were skipped.

    Example: claw-bench tasks --suite claw-mini
    """
    from claw_bench.records import dumps
    from claw_bench.suites import builtin_suites

    s = _suite(suite, strict=strict)
    for t in s.tasks:
        if as_json:
            click.echo(dumps(t.to_dict()))
        else:
            click.echo(f"{t.id:32} {t.difficulty or '-':7} {','.join(t.tags)}")
    if not as_json:
        _log(f"suite {s.name}; built-in suites: {', '.join(builtin_suites())}")
    _log(f"{len(s.tasks)} loaded, {len(s.skipped)} skipped")


@main.command()
@click.option("--suite", "-s", required=True, help="built-in suite name or directory of tasks")
@click.option("--task", "task_ids", multiple=True, help="only these task ids (repeatable)")
@click.option(
    "--build", is_flag=True, help="build the missing images that have a Dockerfile (see --builder)"
)
@click.option(
    "--builder",
    type=click.Choice(["auto", "docker", "claw-sandbox"]),
    default="auto",
    show_default=True,
    help="where images are looked up and built: docker (the engine; docker build), claw-sandbox "
    "(OCI layouts under --layouts; claw-sandbox build, no daemon); auto: docker when an engine "
    "answers, else claw-sandbox",
)
@click.option(
    "--layouts",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="claw-sandbox builder: the folder of OCI image layouts, one per tag, and their "
    "`--oci=TAG=PATH` list DIR/oci-args (default: $CLAW_BENCH_CACHE/images)",
)
@click.option(
    "--from",
    "bases",
    multiple=True,
    metavar="NAME=PATH",
    help="claw-sandbox builder: the local image (OCI layout or `docker save` tar) a Dockerfile's "
    "`FROM NAME` starts from (repeatable)",
)
@click.option(
    "--timeout-multiplier",
    type=click.FloatRange(0, min_open=True),
    default=1.0,
    show_default=True,
    help="multiply each task's build_timeout_sec, as plan's flag does the jobs' timeouts",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per task instead of a table")
@_errors
def images(suite: str, task_ids: tuple[str, ...], build: bool, builder: str, layouts: str | None,
           bases: tuple[str, ...], timeout_multiplier: float, as_json: bool) -> None:  # fmt: skip
    """List each task's image and whether it is here; --build builds the missing ones.

    A Harbor task's image is its [environment] docker_image, else claw-harbor/<task>:<sha12>, built
    from its environment/ folder (a changed Dockerfile gives a new tag). Tasks with neither use the
    default image. Images named by docker_image are never built: docker pull them. With the docker
    builder it needs the docker CLI and a running engine unless every task uses the default image;
    the claw-sandbox builder needs no daemon: it writes each image as an OCI layout under
    --layouts and lists them in DIR/oci-args for `claw-sandbox run --backend bwrap $(cat
    DIR/oci-args)`. Exits 1 when a build failed or an image is still missing after --build.

    Example: claw-bench images -s tb2-tasks/ --build

    Example: claw-bench images -s tb2-tasks/ --build --builder claw-sandbox --layouts imgs

    Example: claw-bench images -s tb2-tasks/ --task fix-git --json | jq -r .image
    """
    from claw_bench.records import dumps

    s = _suite(suite).select(list(task_ids) or None)
    rows = _image_rows(s.tasks, build, builder, layouts, bases, timeout_multiplier)
    for r in rows:
        if as_json:
            click.echo(dumps(r.to_dict()))
        else:
            where = f"  {r.layout}" if r.layout and r.status in ("present", "built") else ""
            click.echo(f"{r.task:32} {r.status:8} {r.image or 'default image'}{where}")
    for r in rows:
        if r.status == "failed":
            how = (
                f"claw-sandbox build {r.context} -t {r.image}"
                if r.layout
                else f"docker build -t {r.image} {r.context}"
            )
            _log(f"--- {r.task}: {how} failed; its last lines:\n{r.output}")
    counts = {
        k: sum(r.status == k for r in rows)
        for k in ("present", "built", "missing", "failed", "default")
    }
    _log(
        f"{len(rows)} tasks: "
        + ", ".join(
            f"{n} {'default image' if k == 'default' else k}" for k, n in counts.items() if n
        )
    )
    pull = sorted({r.image for r in rows if r.status == "missing" and not r.context and r.image})
    if pull:
        _log(f"not built here (named by docker_image): docker pull {' '.join(pull)}")
    if build and (counts["failed"] or counts["missing"]):
        sys.exit(1)


def _image_rows(tasks: Sequence[Any], build: bool, builder: str, layouts: str | None,
                bases: tuple[str, ...], timeout_multiplier: float) -> list:  # fmt: skip
    """`images`' rows: listed or built with the builder asked for (auto: docker when an engine
    answers, else claw-sandbox)."""
    from claw_bench.images import build_images, default_layouts, list_images, pick_builder

    base_map = {}
    for item in bases:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r} is not NAME=PATH", param_hint="--from")
        base_map[name] = path
    needed = any(t.image or t.meta.get("compose") for t in tasks)
    picked, why = pick_builder(builder) if needed else ("docker", "")
    if why:
        _log(why)
    root = (layouts or default_layouts()) if picked == "claw-sandbox" else None
    if build:
        return build_images(tasks, progress=_log, builder=picked, layouts=root, bases=base_map,
                            timeout_multiplier=timeout_multiplier)  # fmt: skip
    return list_images(tasks, layouts=root)


@main.command()
@click.option(
    "--json", "as_json", is_flag=True, help="one JSON object per harness instead of a table"
)
@click.option(
    "--sandbox/--no-sandbox",
    "in_sandbox",
    default=True,
    show_default=True,
    help="also check that each installed harness's executables run inside claw-sandbox "
    "(`claw-sandbox doctor PROGRAM`), where its jobs will look for them",
)
@click.option(
    "--backend", default="auto", show_default=True, help="claw-sandbox backend to check in"
)
@_errors
def harnesses(as_json: bool, in_sandbox: bool, backend: str) -> None:
    """List harness adapters (built-in and from $CLAW_BENCH_HARNESSES) and whether each is
    installed: on PATH here and, unless --no-sandbox, runnable inside claw-sandbox.

    Example: claw-bench harnesses
    """
    from claw_bench.harnesses import list_harnesses, sandbox_check
    from claw_bench.records import dumps

    hs = list_harnesses()
    checks = sandbox_check(hs, backend) if in_sandbox else {}
    for h in hs:
        check = checks.get(h.name)
        if as_json:
            click.echo(dumps({**h.to_dict(), "sandbox": check}))
            continue
        if not h.installed():
            state = f"not installed (needs {', '.join(h.requires)})"
        elif check is None:
            state = "installed"
        elif not check["checked"]:
            state = f"installed here (not checked in a sandbox: {check['why']})"
        elif check["works"]:
            state = "installed (runs in claw-sandbox)"
        else:
            state = f"on PATH here, but does NOT run in claw-sandbox: {check['why']}"
        click.echo(f"{h.name:22} {h.api:10} {state}")


#: plan's options, which rollouts shares (the arguments of `_planned`)
_PLAN_OPTIONS = [
    click.option("--suite", "-s", help="built-in suite name or directory of tasks"),
    click.option(
        "--dataset",
        "-d",
        help="a dataset NAME@VERSION from --registry (in place of --suite), e.g. terminal-bench@2.0",
    ),
    click.option(
        "--registry",
        envvar="CLAW_BENCH_REGISTRY",
        help="registry of -d in Harbor's registry.json format: a path or an http(s) URL "
        "[env CLAW_BENCH_REGISTRY]; datasets are cached under $CLAW_BENCH_CACHE "
        "(default $XDG_CACHE_HOME/claw-bench)",
    ),
    click.option(
        "--timeout-multiplier",
        type=click.FloatRange(0, min_open=True),
        default=1.0,
        show_default=True,
        help="multiply every timeout of the jobs (agent, steps, verifier), as Harbor's flag does",
    ),
    click.option(
        "--verify-network",
        is_flag=True,
        help="the verify step of a task whose allow_internet is true gets the host's network "
        "(its test.sh may install tools); the agent keeps --network",
    ),
    click.option(
        "--harness",
        "-H",
        "harness_names",
        multiple=True,
        required=True,
        help="adapter name or .toml path (repeatable)",
    ),
    click.option(
        "-n",
        "--rollouts",
        "samples",
        type=int,
        default=1,
        show_default=True,
        help="rollouts per (task, harness)",
    ),
    click.option(
        "--network",
        type=click.Choice(NETWORKS),
        help="the jobs' network: none, proxy (only the proxy) or host (the host's network, as in claw-sandbox); default: proxy for model "
        "harnesses, none for oracle / nothing; a task's allow_internet = false always wins",
    ),
    click.option(
        "--proxy",
        "proxy_url",
        help="proxy base URL, e.g. http://127.0.0.1:8000 (needed by model harnesses)",
    ),
    click.option(
        "--proxy-secret-file",
        type=click.Path(dir_okay=False),
        help="HMAC secret shared with the proxy (needed by model harnesses)",
    ),
    click.option("--strict", is_flag=True, help=_STRICT_HELP),
    click.option("--task", "task_ids", multiple=True, help="only these task ids (repeatable)"),
    click.option("--tag", "tags", multiple=True, help="only tasks carrying all these tags"),
    click.option("--run-id", help="prefix of session ids (default: random)"),
    click.option("--model", help="model name the harnesses ask for (default: each adapter's)"),
    click.option("--install", is_flag=True, help="install the harness in each job's setup"),
    click.option(
        "--group-by",
        type=click.Choice(GROUP_BY),
        default="task",
        show_default=True,
        help="group key for group-relative advantages: the task, or task+harness (<task>+<harness>)",
    ),
    click.option("--memory-mb", type=click.IntRange(1), help="job limit: memory"),
    click.option("--pids", type=click.IntRange(1), help="job limit: processes"),
    click.option("--cpus", type=click.FloatRange(0, min_open=True), help="job limit: CPUs"),
    click.option(
        "--pass-threshold",
        type=click.FloatRange(0, 1),
        default=1.0,
        show_default=True,
        help="public suites (ClawGym, PinchBench, Harbor): passed = reward >= THRESHOLD",
    ),
    click.option(
        "--workspace-dir",
        help="public suites: fixed path the workspace is mounted at, given to checkers "
        "(default: remap the task's mount dir to the real workspace)",
    ),
    click.option(
        "--checker-timeout",
        type=click.FloatRange(0, min_open=True),
        help="public suites: seconds before a checker is killed (scores 0) [default: 120]",
    ),
]


def _plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Put plan's options (`_PLAN_OPTIONS`) on a command."""
    for option in reversed(_PLAN_OPTIONS):
        fn = option(fn)
    return fn


def _suite_or_dataset(suite: str | None, dataset: str | None, registry: str | None) -> str:
    """The suite to load: --suite, or the cached folder of -d NAME@VERSION from --registry."""
    if (suite is None) == (dataset is None):
        raise click.UsageError("give one of --suite and -d/--dataset")
    if dataset is None:
        assert suite is not None
        return suite
    if not registry:
        raise click.UsageError("-d/--dataset needs --registry (or CLAW_BENCH_REGISTRY)")
    from claw_bench.datasets import resolve_dataset

    path = resolve_dataset(dataset, registry)
    _log(f"dataset {dataset}: {path}")
    return str(path)


def _planned(
    suite: str | None,
    dataset: str | None,
    registry: str | None,
    timeout_multiplier: float,
    verify_network: bool,
    harness_names: tuple[str, ...],
    samples: int,
    network: str | None,
    proxy_url: str | None,
    proxy_secret_file: str | None,
    strict: bool,
    task_ids: tuple[str, ...],
    tags: tuple[str, ...],
    run_id: str | None,
    model: str | None,
    install: bool,
    group_by: str,
    memory_mb: int | None,
    pids: int | None,
    cpus: float | None,
    pass_threshold: float,
    workspace_dir: str | None,
    checker_timeout: float | None,
    backend: str | None = None,
) -> tuple[list[Task], list[Harness], dict[str, Any]]:
    """The tasks, the harnesses and `plan_jobs`'s other arguments, from plan's options."""
    from claw_bench.harnesses import load_harness
    from claw_bench.loaders import LoadOptions
    from claw_bench.token import read_secret

    if workspace_dir is not None and not workspace_dir.startswith("/"):
        raise click.BadParameter(
            f"{workspace_dir!r} must be an absolute path", param_hint="--workspace-dir"
        )
    options = LoadOptions(
        pass_threshold=pass_threshold,
        workspace_dir=workspace_dir,
        checker_timeout_s=checker_timeout,
    )
    suite = _suite_or_dataset(suite, dataset, registry)
    s = _suite(suite, options, strict, backend).select(list(task_ids) or None, list(tags) or None)
    hs = [load_harness(h) for h in harness_names]
    needs = [h.name for h in hs if h.needs_model]
    if needs and not (proxy_url and proxy_secret_file):
        raise click.UsageError(
            f"harness {needs[0]} talks to a model: give --proxy and --proxy-secret-file"
        )
    for h in hs:
        if not h.installed() and not install:
            _log(
                f"warning: harness {h.name} is not installed here (needs {', '.join(h.requires)}); "
                "pass --install to install it in each job"
            )
    limits = {"memory_mb": memory_mb, "pids": pids, "cpus": cpus}
    kwargs = {
        "samples": samples,
        "proxy_url": proxy_url if needs else None,
        "secret": read_secret(proxy_secret_file) if proxy_secret_file and needs else None,
        "network": network,
        "run_id": run_id,
        "model": model,
        "install": install,
        "group_by": group_by,
        "limits": {k: v for k, v in limits.items() if v is not None},
        "timeout_multiplier": timeout_multiplier,
        "verify_network": verify_network,
        "backend": backend,
    }
    return list(s.tasks), hs, kwargs


def _planned_line(tasks: list[Task], hs: list[Harness], samples: int) -> str:
    return f"{len(tasks)} tasks x {len(hs)} harnesses x {samples} rollouts"


@main.command()
@_plan_options
@click.option(
    "-b",
    "--backend",
    type=click.Choice(["auto", "bwrap", "docker", "process"]),
    default="auto",
    show_default=True,
    help="claw-sandbox backend the jobs will run on: with docker, a Harbor task's compose "
    "sidecars become the job's services; elsewhere such a task is a not_scorable job",
)
@_output("jobs JSONL file")
@_errors
def plan(output: str, **options: Any) -> None:
    """Write one claw.job/v1 per (task, harness, sample), pointed at the proxy.

    Example: claw-bench plan --suite claw-mini --harness claw-agent-chat -n 4
    --proxy http://127.0.0.1:8000 --proxy-secret-file secret.txt | claw-sandbox run > runs.jsonl

    Example: claw-bench plan --suite tb2-tasks/ --harness oracle --harness nothing --network none -o jobs.jsonl

    SUITE may also be a public suite as published: ClawGym-Bench task directories or JSONL,
    PinchBench tasks/ Markdown, Harbor / Terminal-Bench 2 task directories. The built-in
    harnesses oracle (the task's reference solution) and nothing (the floor) call no model and
    need no proxy.
    """
    from claw_bench.plan import plan_jobs
    from claw_bench.records import write_records

    tasks, hs, kwargs = _planned(**options)
    n = write_records(output, plan_jobs(tasks, hs, **kwargs))
    _log(f"planned {n} jobs: {_planned_line(tasks, hs, kwargs['samples'])}")


@main.command()
@_plan_options
@click.option(
    "-b",
    "--backend",
    default="auto",
    show_default=True,
    help="claw-sandbox backend the jobs run in (auto, bwrap, docker, process)",
)
@click.option(
    "-p",
    "--parallel",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="jobs run at the same time",
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="local",
    show_default=True,
    help="claw-sandbox run --executor: local, or ray (the jobs as Ray tasks; needs "
    "claw-sandbox[ray])",
)
@click.option(
    "--sandbox-arg",
    "sandbox_args",
    multiple=True,
    metavar="ARG",
    help="one more argument for claw-sandbox run (repeatable), e.g. --sandbox-arg=--ro-path "
    "--sandbox-arg=/opt/venv",
)
@click.option(
    "--jobs",
    "jobs_output",
    callback=output_path,
    help="also write the planned jobs to this JSONL file (before they run)",
)
@click.option(
    "--runs",
    "runs_output",
    callback=output_path,
    help="keep the runs in this JSONL file; it is appended to and resumed from, as by "
    "claw-sandbox run -o (give the same --run-id to resume)",
)
@_output("outcomes JSONL file")
@_errors
def rollouts(
    backend: str,
    parallel: int,
    executor: str,
    sandbox_args: tuple[str, ...],
    jobs_output: str | None,
    runs_output: str | None,
    output: str,
    **options: Any,
) -> None:
    """Plan, run in claw-sandbox and score: `plan | claw-sandbox run | score` in one command.

    Takes plan's options; the jobs run through the `claw-sandbox run` command (on PATH) with
    --backend, --parallel and --executor, and claw.outcome/v1 records come out, in (task,
    harness, sample) order. The last line on stderr counts passed, scored, infra errors and not
    scorable apart. Rubric-graded tasks come out not_scorable: keep --runs and score them with
    `claw-bench score --judge-url`.

    Example: claw-bench rollouts --suite claw-mini --harness claw-agent-chat -n 4
    --proxy http://127.0.0.1:8000 --proxy-secret-file secret.txt --backend bwrap
    --runs runs.jsonl -o outcomes.jsonl

    Example: claw-bench rollouts -s claw-toy --harness oracle --executor ray | claw-bench report
    """
    from claw_bench.records import write_records
    from claw_bench.rollouts import rollouts as run_rollouts
    from claw_bench.rollouts import sandbox_cli

    tasks, hs, kwargs = _planned(backend=backend, **options)
    sandbox = sandbox_cli(
        backend=backend, parallel=parallel, executor=executor, output=runs_output, args=sandbox_args
    )

    def run(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if jobs_output is not None:
            write_records(jobs_output, jobs)
        _log(f"running {len(jobs)} jobs: {_planned_line(tasks, hs, kwargs['samples'])}")
        return list(sandbox(jobs))

    s = run_rollouts(tasks, hs, run, **kwargs)
    write_records(output, s.outcomes)
    n = s.summary()
    _log(
        f"scored {n['rollouts']} rollouts: {n['passed']} passed, {n['scored']} scored, "
        f"{n['infra_errors']} infra errors, {n['not_scorable']} not scorable"
    )


@main.command()
@click.option("--suite", "-s", required=True, help="built-in suite name or directory of tasks")
@click.option("--task", "task_ids", multiple=True, help="only these task ids (repeatable)")
@click.option("--tag", "tags", multiple=True, help="only tasks carrying all these tags")
@_output("script JSONL file for claw-proxy's scripted engine")
@click.option(
    "--slip",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="a weaker teacher: on this fraction of the tasks (rounded) the expert skips its last "
    "tool call",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="which tasks slip (with --slip)"
)
@click.option(
    "-n",
    "--rollouts",
    "samples",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="rollouts per (task, harness) the script is for (plan -n): above 1 the slips are "
    "spread evenly over each task's rollouts (session tag `sample`)",
)
@click.option(
    "--harness",
    help="the harness the script is played through: its own tools (claude-code: Read / Write; "
    "openclaw-*: read / write) and its sessions only (default: claw-agent's tools, any harness)",
)
@_errors
def expert(
    suite: str,
    task_ids: tuple[str, ...],
    tags: tuple[str, ...],
    output: str,
    slip: float,
    seed: int,
    samples: int,
    harness: str | None,
) -> None:
    """Write a teacher script: each task's expert solution as claw-proxy scripted-engine answers.

    One line per expert step, keyed to the task's sessions (session tag `task`): tool calls as
    {"tool_calls": [...]}, which the proxy renders in the policy's own tool-call format, and the
    final answer as {"text": ...}. Only generated task families (e.g. claw-toy's toy-steps)
    carry expert solutions. Run claw-agent-chat (or -anthropic) jobs planned for the same tasks
    against `claw-proxy serve --engine scripted:FILE --tokenizer STUDENT_DIR --record calls.jsonl`
    and the calls are recorded in the student's tokenization, ready for SFT. --slip P makes a
    weaker teacher that stops one tool call early on a seeded fraction P of the tasks; with -n
    S > 1 (plan the jobs with the same -n) each task is played S times and its slips spread over
    them, so the same prompt is seen both finished and abandoned. --harness claude-code (or
    openclaw-chat, ...) plays the expert through that real harness, with its own tool names.

    Example: claw-bench expert -s claw-toy --tag toy-steps --tag train -o expert.jsonl
    """
    from claw_bench.families import expert_script
    from claw_bench.records import write_records

    s = _suite(suite).select(list(task_ids) or None, list(tags) or None)
    lines = expert_script(list(s.tasks), slip=slip, seed=seed, samples=samples, harness=harness)
    n = write_records(output, lines)
    _log(f"wrote {n} scripted answers for {len(s.tasks)} tasks")


@main.command()
@click.argument("runs", default="-")
@click.option(
    "--pass-threshold",
    "threshold",
    type=click.FloatRange(0, 1),
    help="passed = reward >= this (default: verifier exit code, or the task's pass_threshold)",
)
@_output("outcomes JSONL file")
@click.option(
    "--judge-url",
    help="LLM judge base URL for rubric-graded tasks (OpenAI: with /v1; Anthropic: without)",
)
@click.option("--judge-model", help="model name the judge is asked for")
@click.option(
    "--judge-api",
    type=click.Choice(JUDGE_APIS),
    default="openai",
    show_default=True,
    help="API the judge speaks",
)
@click.option(
    "--judge-key-env", metavar="VAR", help="environment variable holding the judge's API key"
)
@click.option(
    "--judge-cache",
    metavar="PATH",
    help="JSONL cache of rubric-chain verdicts (default: RUNS.judge-cache.jsonl next to a runs "
    "file; none for stdin)",
)
@click.option(
    "--judge-retries",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="times a criterion is asked again after a network error, HTTP 5xx / 429 or an "
    "unparsable answer (then the outcome is infra_error)",
)
@_errors
def score(
    runs: str,
    threshold: float | None,
    output: str,
    judge_url: str | None,
    judge_model: str | None,
    judge_api: str,
    judge_key_env: str | None,
    judge_cache: str | None,
    judge_retries: int,
) -> None:
    """Score claw.run/v1 records into claw.outcome/v1 records (infra errors stay infra_error).

    Tasks graded by an LLM rubric (PinchBench llm_judge / hybrid, ClawGym hybrid, rubric.json
    chains) are scored with --judge-url; without it they are not_scorable. Rubric chains ask one
    question per criterion and keep the answers in --judge-cache, so scoring again asks nothing
    twice.
    Example: claw-sandbox run jobs.jsonl | claw-bench score > outcomes.jsonl

    Example: claw-bench score runs.jsonl --judge-url http://127.0.0.1:8000/v1 --judge-model gpt-4o-mini
    --judge-key-env OPENAI_API_KEY > outcomes.jsonl
    """
    from claw_bench.loaders import Judge, JudgeCache
    from claw_bench.records import RUN, iter_records, write_records
    from claw_bench.score import check_run, score_run

    judge = None
    if judge_url:
        if not judge_model:
            raise click.UsageError("--judge-url needs --judge-model")
        key = os.environ.get(judge_key_env) if judge_key_env else None
        if judge_key_env and key is None:
            raise click.UsageError(f"--judge-key-env {judge_key_env}: the variable is not set")
        cache = judge_cache or (None if runs == "-" else f"{runs}.judge-cache.jsonl")
        judge = Judge(
            base_url=judge_url,
            model=judge_model,
            api=judge_api,
            api_key=key,
            retries=judge_retries,
            cache=JudgeCache(cache) if cache else None,
        )

    def gen():
        for i, r in enumerate(iter_records(runs, RUN, check=check_run), start=1):
            yield score_run(
                r,
                threshold=threshold,
                where=f"{'<stdin>' if runs == '-' else runs} record {i}",
                judge=judge,
            )

    outs = list(gen())
    write_records(output, outs)
    ok = sum(o["status"] == "ok" for o in outs)
    unscorable = sum(o["status"] == "not_scorable" for o in outs)
    _log(
        f"scored {len(outs)} runs: {sum(bool(o['passed']) for o in outs)} passed, {ok} scored, "
        f"{len(outs) - ok - unscorable} infra errors, {unscorable} not scorable (need --judge-url)"
    )


@main.command()
@click.argument("runs", default="-")
@click.option(
    "--suite", "-s", required=True, help="the suite the runs were planned from (name or path)"
)
@click.option(
    "--calls",
    "calls_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="claw-proxy's claw.call/v1 records of these sessions (with raw request/response)",
)
@_output("runs JSONL file")
@_errors
def regrade(runs: str, suite: str, calls_path: str, output: str) -> None:
    """Re-run PinchBench-style checkers with each session's transcript (from the proxy's call records).

    Runs of other tasks pass through unchanged. The checkers run here, on the host, on the
    snapshot of each run's final workspace.
    Example: claw-sandbox run jobs.jsonl | claw-bench regrade --suite pinchbench/tasks --calls calls.jsonl
    | claw-bench score > outcomes.jsonl
    """
    from claw_bench.loaders.regrade import regrade_run
    from claw_bench.records import RUN, iter_records, read_records, write_records
    from claw_bench.suites import load_suite

    s = load_suite(suite)
    calls = read_records(calls_path, "claw.call/v1")
    n = 0

    def gen():
        nonlocal n
        for r in iter_records(runs, RUN):
            task_id = (r.get("meta") or {}).get("task")
            task = next((t for t in s.tasks if t.id == task_id), None)
            if task is not None and task.source == "pinchbench":
                n += 1
                yield regrade_run(r, task, calls)
            else:
                yield r

    write_records(output, gen())
    _log(f"regraded {n} runs with their transcripts")


@main.command()
@click.argument("outcomes", default="-")
@click.option(
    "--runs",
    "runs_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="the claw.run/v1 records the outcomes were scored from",
)
@click.option(
    "--jobs-dir",
    "-j",
    required=True,
    type=click.Path(file_okay=False),
    help="the job directory: one folder per trial is written in it",
)
@_output("outcomes JSONL file (with meta.trial_dir)")
@_errors
def trials(outcomes: str, runs_path: str, jobs_dir: str, output: str) -> None:
    """Write Harbor's per-trial job directory: JOBS_DIR/<task>__<id>/ with agent/, verifier/,
    artifacts/ and result.json, from the runs and their outcomes; the outcomes pass through with
    meta.trial_dir, for claw-bench report --trials.

    Example: claw-sandbox run jobs.jsonl > runs.jsonl; claw-bench score runs.jsonl
    | claw-bench trials --runs runs.jsonl --jobs-dir jobs/tb2 > outcomes.jsonl
    """
    from pathlib import Path

    from claw_bench.records import OUTCOME, RUN, iter_records, read_records, write_records
    from claw_bench.trials import export_trials

    runs = read_records(runs_path, RUN)
    n = write_records(output, export_trials(iter_records(outcomes, OUTCOME), runs, Path(jobs_dir)))
    _log(f"wrote {n} trial folders under {jobs_dir}")


@main.command(name="report")
@click.argument("outcomes", default="-")
@click.option(
    "-k", "ks", type=int, multiple=True, help="k values (default: 1 and the largest sample count)"
)
@click.option(
    "--compare",
    "other",
    type=click.Path(dir_okay=False),
    help="baseline outcomes (before), shown side by side",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    callback=output_path,
    help="also draw the report to this image file; .png is added when it has no extension "
    "(needs claw-bench[plot])",
)
@click.option("--json", "as_json", is_flag=True, help="print the report as one JSON object")
@click.option("--no-tasks", is_flag=True, help="leave out the per-task table")
@click.option(
    "--reward-cutoff",
    "thresholds",
    type=click.FloatRange(0, 1),
    multiple=True,
    help="also show the pass rate as reward >= this (repeatable, e.g. --reward-cutoff 0.5 --reward-cutoff 1)",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 0.999),
    default=0.95,
    show_default=True,
    help="confidence level of the bootstrap intervals",
)
@click.option(
    "--rounds",
    type=click.IntRange(100, 100000),
    default=2000,
    show_default=True,
    help="bootstrap rounds",
)
@click.option("--seed", type=int, default=0, show_default=True, help="bootstrap random seed")
@click.option(
    "--trials",
    "list_trials",
    is_flag=True,
    help="also list each trial's folder (meta.trial_dir, written by claw-bench trials)",
)
@_errors
def report_(
    outcomes: str,
    ks: tuple[int, ...],
    other: str | None,
    plot_path: str | None,
    as_json: bool,
    no_tasks: bool,
    thresholds: tuple[float, ...],
    confidence: float,
    rounds: int,
    seed: int,
    list_trials: bool,
) -> None:
    """Pass@1 and unbiased Pass@k per harness and per task, with bootstrap confidence intervals.

    Example: claw-bench report outcomes.jsonl -k 1 -k 4 --compare baseline.jsonl --plot passk.png

    Example: claw-bench report outcomes.jsonl --trials  (each trial's Harbor-style folder)

    Example: claw-bench report outcomes.jsonl --reward-cutoff 0.5 --reward-cutoff 1.0
    """
    from claw_bench.records import OUTCOME, read_records
    from claw_bench.report import (
        check_outcome,
        compare,
        plot_report,
        render_compare,
        render_text,
        report,
    )

    opts: dict[str, Any] = {
        "ks": list(ks) or None,
        "confidence": confidence,
        "rounds": rounds,
        "seed": seed,
    }
    rows = read_records(outcomes, OUTCOME, check_outcome)
    rep = report(rows, **opts, thresholds=list(thresholds) or None)
    if list_trials:
        from claw_bench.trials import trial_rows

        rep["trials"] = trial_rows(rows)
    base = None
    if other:
        base = report(read_records(other, OUTCOME, check_outcome), **{**opts, "ks": rep["ks"]})
        cmp = compare(base, rep)
        click.echo(
            json.dumps(cmp) if as_json else render_compare(cmp, per_task=not no_tasks), nl=as_json
        )
    else:
        click.echo(
            json.dumps(rep) if as_json else render_text(rep, per_task=not no_tasks), nl=as_json
        )
    if list_trials and not as_json:
        from claw_bench.trials import render_trials

        click.echo(render_trials(rep["trials"]), nl=False)
    if plot_path:
        _log(f"wrote {plot_report(rep, plot_path, other=base)}")


@main.command()
@click.option(
    "--suite", "-s", default="claw-mini", show_default=True, help="built-in suite name or directory"
)
@click.option("--task", "task_ids", multiple=True, help="only these task ids (repeatable)")
@click.option(
    "--backend",
    default="auto",
    show_default=True,
    help="claw-sandbox backend the checks run in (bwrap, docker, process, auto)",
)
@_errors
def check(suite: str, task_ids: tuple[str, ...], backend: str) -> None:
    """Prove tasks sound: the untouched workspace fails and the reference solution passes.

    Each task runs in claw-sandbox (`claw-sandbox run --backend`), never on the host.
    Prints one JSON line per (task, mode); exits 1 when any task is unsound.
    Example: claw-bench check --suite claw-mini --task csv-dedupe-contacts --backend bwrap
    """
    from claw_bench.check import check_tasks
    from claw_bench.records import dumps

    s = _suite(suite).select(list(task_ids) or None)
    bad = []
    for r in check_tasks(list(s.tasks), backend=backend):
        mode = r["mode"]
        click.echo(dumps({k: v for k, v in r.items() if k != "output"}))
        if r["passed"] != (mode == "solution"):
            bad.append(f"{r['task']} ({mode}: passed={r['passed']}): {r['output'][-500:]}")
    if bad:
        _log("unsound tasks:\n" + "\n".join(bad))
        sys.exit(1)
    _log(f"{len(s.tasks)} tasks sound")
