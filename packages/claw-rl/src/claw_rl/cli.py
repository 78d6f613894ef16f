"""The `claw-rl` command line: a thin click group over the library."""

from pathlib import Path

import click

from claw_rl import __version__
from claw_rl.errors import ClawError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-rl")
def main() -> None:
    """claw-rl: PPO and GRPO learners on tree-packed samples."""


@main.command("init-tiny")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, help="Seed for the tokenizer corpus and the weights.")
@click.option("--layers", default=2, show_default=True, help="Number of transformer layers.")
@click.option("--hidden", default=128, show_default=True, help="Hidden size.")
def init_tiny_cmd(out_dir: Path, seed: int, layers: int, hidden: int) -> None:
    """Write a tiny random-weight Qwen3 model and a locally trained tokenizer to OUT_DIR.

    The tokenizer is a byte-level BPE trained in-process (no hub download) and carries a
    Qwen3-style chat template with tools. The directory loads with AutoModelForCausalLM /
    AutoTokenizer offline.

    Example:

        claw-rl init-tiny runs/tiny && claw-proxy serve --engine transformers:runs/tiny ...
    """
    from claw_rl.tiny import TinySpec, init_tiny

    try:
        path = init_tiny(out_dir, TinySpec(seed=seed, num_hidden_layers=layers, hidden_size=hidden))
    except ClawError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))
