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
