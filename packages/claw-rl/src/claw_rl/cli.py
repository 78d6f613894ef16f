"""The `claw-rl` command line: a thin click group over the library."""

import click

from claw_rl import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-rl")
def main() -> None:
    """claw-rl: see `claw-rl COMMAND --help`."""
