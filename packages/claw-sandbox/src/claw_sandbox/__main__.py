"""`python -m claw_sandbox` is the `claw-sandbox` command."""

from claw_sandbox.cli import main

main()
