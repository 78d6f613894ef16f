"""Every command of the CLI answers --help; --version prints the package version."""

import subprocess
import sys

import click
from claw_bench import __version__
from claw_bench.cli import main
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


def test_help_imports_no_library_module():
    """`claw-bench --help` and `claw-bench plan --help` import click and no library module that
    pulls numpy, httpx or the task loaders (each command imports what it calls when it runs)."""
    code = (
        "import sys\n"
        "from claw_bench.cli import main\n"
        "for argv in (['--help'], ['plan', '--help'], ['rollouts', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, exc.code\n"
        "heavy = ('numpy', 'httpx', 'claw_bench.plan', 'claw_bench.suites', 'claw_bench.report')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
