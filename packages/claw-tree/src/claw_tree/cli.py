"""The `claw-tree` command line: a thin click group over the library."""

import click

from claw_tree import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-tree")
def main() -> None:
    """claw-tree: see `claw-tree COMMAND --help`."""
