"""The `claw-proxy` command line: a thin click group over the library."""

import click

from claw_proxy import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-proxy")
def main() -> None:
    """claw-proxy: see `claw-proxy COMMAND --help`."""
