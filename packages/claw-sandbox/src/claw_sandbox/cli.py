"""The `claw-sandbox` command line: a thin click group over the library."""

import click

from claw_sandbox import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-sandbox")
def main() -> None:
    """claw-sandbox: see `claw-sandbox COMMAND --help`."""
