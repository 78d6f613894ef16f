"""Output-path mistakes are one-line usage errors (exit 2) raised before any work is done."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from claw_tree._cli_paths import output_path
from claw_tree.cli import main
from click.testing import CliRunner
from tree_testlib import call, outcome


def _args(cmd: str, inp: Path) -> list[str]:
    """Valid arguments of each command with an output, ending with its output option."""
    (inp / "calls.jsonl").write_text(json.dumps(call("s1", 0, [1, 2, 3], [4, 5])) + "\n")
    (inp / "outcomes.jsonl").write_text(json.dumps(outcome("s1", 1.0)) + "\n")
    return {
        "build": ["build", str(inp / "calls.jsonl"), "-o"],
        "samples": ["samples", str(inp / "calls.jsonl"), str(inp / "outcomes.jsonl"), "--output"],
        "sft-samples": ["sft-samples", str(inp / "calls.jsonl"), "-o"],
    }[cmd]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")
    }


@pytest.mark.parametrize("mistake", ["directory", "directory/", "missing parent"])
@pytest.mark.parametrize("cmd", ["build", "samples", "sft-samples"])
def test_bad_output_path_is_a_one_line_usage_error(tmp_path, cmd, mistake):
    """A directory, or a file in a missing directory, exits 2 with one error line naming it; nothing is written."""
    inp, work = tmp_path / "in", tmp_path / "work"
    inp.mkdir()
    (work / "d").mkdir(parents=True)
    target = {
        "directory": str(work / "d"),
        "directory/": str(work / "new") + "/",
        "missing parent": str(work / "missing" / "sub" / "out.jsonl"),
    }[mistake]
    args = [*_args(cmd, inp), target]
    before = _tree(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and target.rstrip("/") in errors[0], r.stderr
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("cmd", ["build", "samples", "sft-samples"])
def test_good_output_path_still_writes(tmp_path, cmd):
    """The same arguments with a file in an existing directory run and write that file."""
    inp = tmp_path / "in"
    inp.mkdir()
    r = CliRunner().invoke(main, [*_args(cmd, inp), str(tmp_path / "out.jsonl")])
    assert r.exit_code == 0, r.output
    first = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    want = {
        "build": ("session", "s1"),
        "samples": ("schema", "claw.sample/v1"),
        "sft-samples": ("algo", "sft"),
    }[cmd]
    assert first[want[0]] == want[1]


def test_every_output_option_is_checked():
    """Each -o/--output option of every command uses the output-path check."""
    seen = []
    for name, cmd in main.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and {"-o", "--output"} & set(p.opts):
                seen.append(name)
                assert p.callback is output_path, f"{name} {p.opts}"
    assert sorted(seen) == ["build", "samples", "sft-samples"]
