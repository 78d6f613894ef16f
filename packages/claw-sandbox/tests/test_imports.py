"""`import claw_sandbox` and its CLI stay light: docker and ray load only when their backend is used."""

import subprocess
import sys

HEAVY = ("docker", "ray", "torch")


def test_import_and_cli_pull_no_backend_dependency():
    """A fresh interpreter importing claw_sandbox and claw_sandbox.cli, and printing --help, loads no docker/ray."""
    code = (
        "import sys\n"
        "import claw_sandbox, claw_sandbox.cli\n"
        "try:\n"
        "    claw_sandbox.cli.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1].split() == ["LOADED"]
