"""Every command of the CLI answers --help; --version prints the package version."""

import json

import click
from claw_sandbox import __version__
from claw_sandbox.cli import main
from click.testing import CliRunner


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


def test_version():
    """--version prints the installed version."""
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_every_command_has_help_with_example():
    """Each command's --help works and its help text shows an Example."""
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for path, cmd in _commands(main):
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if not isinstance(cmd, click.Group):
            assert "Example" in (cmd.help or ""), f"{' '.join(path)} has no Example in its help"


def test_run_reads_stdin_and_writes_runs_to_stdout(tmp_path):
    """`claw-sandbox run` pipes JSONL through; bad lines are error runs; summary goes to stderr."""
    lines = [
        json.dumps({"schema": "claw.job/v1", "job_id": "a", "command": ["echo", "A"]}),
        "{broken",
    ]
    result = CliRunner().invoke(
        main,
        ["run", "--backend", "process", "--workdir", str(tmp_path)],
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.output
    runs = {r["job_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert runs["a"]["stdout_tail"] == "A\n"
    assert runs["<stdin>:2"]["status"] == "error" and "not JSON" in runs["<stdin>:2"]["error"]
    assert "2 jobs: 1 ok, 0 timeout, 1 error, 0 infra_error" in result.stderr
    assert "does NOT isolate" in result.stderr


def test_run_names_a_missing_jobs_file(tmp_path):
    """A jobs file that cannot be read is a clear error."""
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing.jsonl")])
    assert result.exit_code != 0 and "missing.jsonl" in result.output


def test_exec_passes_output_and_exit_code(tmp_path):
    """`claw-sandbox exec` prints the command's output and exits with its code."""
    result = CliRunner().invoke(
        main, ["exec", "--backend", "process", "--", "sh", "-c", "echo out; exit 3"]
    )
    assert result.exit_code == 3 and result.stdout == "out\n"
    result = CliRunner().invoke(
        main, ["exec", "-b", "process", "--timeout", "0.2", "--", "sleep", "5"]
    )
    assert result.exit_code == 124


def test_doctor_lists_every_backend():
    """doctor reports bwrap, docker, process, cgroups and the auto choice."""
    result = CliRunner().invoke(main, ["doctor", "--json"])
    rows = {r["name"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert {"bwrap", "docker", "process", "cgroups", "auto"} <= set(rows)
    assert rows["process"]["works"] and "NOT isolate" in rows["process"]["why"]
    assert rows["auto"]["why"].startswith("auto picks ")


def _job_line(job_id, command="true", **fields):
    return json.dumps({"schema": "claw.job/v1", "job_id": job_id, "command": command, **fields})


def test_run_refuses_bad_output_paths_before_any_work(tmp_path):
    """`-o DIR` and `-o missing/dir/file`: one line on stderr, exit 2, no job run."""
    jobs = tmp_path / "jobs.jsonl"
    marker = tmp_path / "ran"
    jobs.write_text(_job_line("a", f"touch {marker}") + "\n")
    for out in (tmp_path, tmp_path / "missing" / "dir" / "runs.jsonl"):
        result = CliRunner().invoke(main, ["run", str(jobs), "-o", str(out), "-b", "process"])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and str(out) in result.stderr
        assert "Traceback" not in result.output
    assert not marker.exists()


def test_run_retry_errors_reruns_fixed_jobs_and_keeps_one_record_each(tmp_path):
    """A job that ended in error is skipped on resume, but rerun with --retry-errors after its
    line is fixed; the runs file then holds one record per job."""
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl"
    args = ["run", str(jobs), "-o", str(out), "-b", "process", "--workdir", str(tmp_path / "w")]
    jobs.write_text(_job_line("good") + "\n" + _job_line("bad", timeout_s=-1) + "\n")
    assert CliRunner().invoke(main, args).exit_code == 0
    jobs.write_text(_job_line("good") + "\n" + _job_line("bad", ["echo", "fixed"]) + "\n")
    assert CliRunner().invoke(main, args).exit_code == 0
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["job_id"], r["status"]) for r in first) == [("bad", "error"), ("good", "ok")]
    result = CliRunner().invoke(main, [*args, "--retry-errors"])
    assert result.exit_code == 0, result.output
    rows = {r["job_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(out.read_text().splitlines()) == 2 and rows["bad"]["status"] == "ok"
    assert rows["good"] == next(r for r in first if r["job_id"] == "good")
    assert rows["bad"]["stdout_tail"] == "fixed\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.jsonl", "runs.jsonl", "w"]


def test_run_exits_nonzero_when_no_line_is_a_valid_job(tmp_path):
    """Every line invalid, or no line at all: the runs are still written, and the exit is 1."""
    for text in ("{broken\n" + _job_line("x", timeout_s="soon") + "\n", ""):
        result = CliRunner().invoke(
            main, ["run", "-b", "process", "--workdir", str(tmp_path)], input=text
        )
        assert result.exit_code == 1, result.output
        assert "no valid job" in result.stderr
        assert all(json.loads(r)["status"] == "error" for r in result.stdout.splitlines())
