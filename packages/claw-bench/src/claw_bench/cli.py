"""The `claw-bench` command line: a thin click group over the library."""

import click

from claw_bench import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-bench")
def main() -> None:
    """claw-bench: see `claw-bench COMMAND --help`."""
