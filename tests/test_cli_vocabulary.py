"""The five CLIs follow docs/cli.md: help on every option, -o/--output for outputs, an Example: per command,
one meaning per option name."""

from __future__ import annotations

import importlib

import click
import pytest

CLIS = {
    "claw-sandbox": "claw_sandbox.cli",
    "claw-proxy": "claw_proxy.cli",
    "claw-tree": "claw_tree.cli",
    "claw-rl": "claw_rl.cli",
    "claw-bench": "claw_bench.cli",
}

# The commands that write one file or directory as their result (docs/cli.md, "Outputs").
OUTPUT_COMMANDS = {
    "claw-sandbox run",
    "claw-sandbox build",
    "claw-tree build",
    "claw-tree samples",
    "claw-tree sft-samples",
    "claw-rl train",
    "claw-rl sft",
    "claw-rl values",
    "claw-rl logprobs",
    "claw-bench plan",
    "claw-bench rollouts",
    "claw-bench score",
    "claw-bench regrade",
    "claw-bench trials",
    "claw-bench expert",
}

# Spellings docs/cli.md retired: each had two meanings, or another name has the meaning now.
RETIRED = {"--out", "--threshold"}


def _commands() -> list[tuple[str, click.Command]]:
    """Every leaf command of the five CLIs as ("claw-x sub", command)."""
    out: list[tuple[str, click.Command]] = []

    def walk(name: str, cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            for sub, c in sorted(cmd.commands.items()):
                walk(f"{name} {sub}", c)
        else:
            out.append((name, cmd))

    for prog, module in CLIS.items():
        walk(prog, importlib.import_module(module).main)
    return out


COMMANDS = _commands()
IDS = [name for name, _ in COMMANDS]


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]


def _kind(opt: click.Option) -> str:
    """A coarse meaning class: a flag, a count/number, or a text/path value."""
    if opt.is_flag:
        return "flag"
    if isinstance(opt.type, (click.types.IntParamType, click.types.FloatParamType)):
        return "number"
    return "text"


def test_every_cli_has_commands():
    """The walk finds commands in all five CLIs (an empty walk would pass every check below)."""
    assert {name.split()[0] for name in IDS} == set(CLIS)
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_every_option_has_help(name, cmd):
    """Every visible option of every command says what it does."""
    missing = ["/".join(o.opts) for o in _options(cmd) if not (o.help or "").strip()]
    assert not missing, f"{name}: options without help: {missing}"


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_every_command_help_has_an_example(name, cmd):
    """Every command's help text carries an `Example:` line."""
    assert "Example:" in (cmd.help or ""), f"{name}: no Example: in its help"


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_outputs_are_spelled_o_output(name, cmd):
    """An output option is exactly -o/--output; no option uses a retired spelling; -o means nothing else."""
    for opt in _options(cmd):
        names = set(opt.opts) | set(opt.secondary_opts)
        assert not names & RETIRED, (
            f"{name}: retired spelling {sorted(names & RETIRED)} (see docs/cli.md)"
        )
        if names & {"-o", "--output"} or any(n.startswith(("--out-", "--output")) for n in names):
            assert names == {"-o", "--output"}, f"{name}: output option spelled {sorted(names)}"
    has_output = any(set(o.opts) == {"-o", "--output"} for o in _options(cmd))
    assert has_output == (name in OUTPUT_COMMANDS), (
        f"{name}: -o/--output {'missing' if not has_output else 'unexpected'}"
    )


def test_one_meaning_per_option_name():
    """An option name is a flag, a number or a text/path value the same way in every command
    (e.g. --samples is never a count in one place and a file in another)."""
    kinds: dict[str, dict[str, str]] = {}
    for name, cmd in COMMANDS:
        for opt in _options(cmd):
            for n in opt.opts:
                if n.startswith("--"):
                    kinds.setdefault(n, {})[name] = _kind(opt)
    mixed = {n: k for n, k in kinds.items() if len(set(k.values())) > 1}
    assert not mixed, f"option names with two kinds of value: {mixed}"


def test_group_key_is_spelled_one_way():
    """Every --group-by offers the per-harness group as `task+harness`, never `task-harness`."""
    seen = []
    for name, cmd in COMMANDS:
        for opt in _options(cmd):
            if "--group-by" in opt.opts:
                assert isinstance(opt.type, click.Choice), name
                assert (
                    "task+harness" in opt.type.choices and "task-harness" not in opt.type.choices
                ), name
                seen.append(name)
    assert sorted(seen) == ["claw-bench plan", "claw-bench rollouts", "claw-tree samples"]
