"""Every command of the CLI answers --help; --version prints the package version."""

import click
from claw_rl import __version__
from claw_rl.cli import main
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
