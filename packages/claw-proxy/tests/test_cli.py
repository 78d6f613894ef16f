"""Every command of the CLI answers --help; --version prints the package version."""

from pathlib import Path

import click
from claw_proxy import __version__
from claw_proxy.cli import main
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


def test_token_and_calls_commands(tmp_path):
    """`token` mints a verifiable token with tags; `calls` prints checked records."""
    import json

    from claw_proxy import CallWriter, verify_token

    secret = tmp_path / "secret.txt"
    secret.write_text("k3y\n")
    r = CliRunner().invoke(
        main, ["token", "run-1", "--secret-file", str(secret), "--tag", "task=t1"]
    )
    assert r.exit_code == 0, r.output
    assert verify_token(r.output.strip(), "k3y").tags == {"task": "t1"}
    bad = CliRunner().invoke(main, ["token", "has.dot", "--secret-file", str(secret)])
    assert bad.exit_code != 0 and "session id" in bad.output
    w = CallWriter(tmp_path / "calls.jsonl")
    example = (
        Path(__file__).resolve().parents[3] / "formats" / "claw.call.v1.example.jsonl"
    ).read_text()
    for line in example.splitlines():
        w.write(json.loads(line))
    w.close()
    r = CliRunner().invoke(main, ["calls", str(tmp_path / "calls.jsonl"), "--summary"])
    assert r.exit_code == 0 and r.output.count("\n") == 2 and "s-3f2a\t1\topenai.chat" in r.output
    (tmp_path / "bad.jsonl").write_text('{"schema": "claw.call/v1"}\n')
    r = CliRunner().invoke(main, ["calls", str(tmp_path / "bad.jsonl")])
    assert r.exit_code != 0 and "bad.jsonl:1: missing field" in r.output
