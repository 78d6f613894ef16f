"""`import claw_proxy` and its CLI stay light: the transformers engine's torch loads only when that engine starts."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "tokenizers", "vllm")


def test_import_and_cli_pull_no_engine_dependency():
    """A fresh interpreter importing claw_proxy and claw_proxy.cli, and printing --help, loads no torch/transformers."""
    code = (
        "import sys\n"
        "import claw_proxy, claw_proxy.cli\n"
        "try:\n"
        "    claw_proxy.cli.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1].split() == ["LOADED"]
