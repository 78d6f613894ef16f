"""Output-path mistakes are one-line usage errors (exit 2) raised before any work is done."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from claw_bench._cli_paths import output_path
from claw_bench.cli import main
from click.testing import CliRunner

DATA = Path(__file__).parent / "data" / "outcomes_handmade.jsonl"
RUN = {
    "schema": "claw.run/v1",
    "job_id": "j",
    "status": "infra_error",
    "error": "no bwrap",
    "meta": {"session": "s", "task": "t", "harness": "h"},
}


def _args(cmd: str, inp: Path) -> list[str]:
    """Valid arguments of each command with an output, ending with its output option."""
    (inp / "secret").write_text("k")
    (inp / "runs.jsonl").write_text(json.dumps(RUN) + "\n")
    (inp / "calls.jsonl").write_text("")
    return {
        "plan": [
            "plan",
            "-s",
            "claw-toy",
            "-H",
            "claw-agent-text",
            "--proxy",
            "http://127.0.0.1:8000",
            "--proxy-secret-file",
            str(inp / "secret"),
            "-o",
        ],
        "score": ["score", str(inp / "runs.jsonl"), "-o"],
        "expert": ["expert", "-s", "claw-toy", "--tag", "toy-steps", "-o"],
        "regrade": [
            "regrade",
            str(inp / "runs.jsonl"),
            "-s",
            "claw-toy",
            "--calls",
            str(inp / "calls.jsonl"),
            "--output",
        ],
        "report": ["report", str(DATA), "--plot"],
        "rollouts": ["rollouts", "-s", "claw-toy", "-H", "oracle", "--runs"],
    }[cmd]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")
    }


@pytest.mark.parametrize("mistake", ["directory", "missing parent"])
@pytest.mark.parametrize("cmd", ["plan", "score", "regrade", "report", "expert", "rollouts"])
def test_bad_output_path_is_a_one_line_usage_error(tmp_path, cmd, mistake):
    """A directory, or a file in a missing directory, exits 2 with one error line naming it; nothing is written."""
    inp, work = tmp_path / "in", tmp_path / "work"
    inp.mkdir()
    (work / "d").mkdir(parents=True)
    target = work / "d" if mistake == "directory" else work / "missing" / "sub" / "out.jsonl"
    args = [*_args(cmd, inp), str(target)]
    before = _tree(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(target) in errors[0], r.stderr
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("cmd", ["plan", "score", "regrade"])
def test_good_output_path_still_writes(tmp_path, cmd):
    """The same arguments with a file in an existing directory run and write that file."""
    inp = tmp_path / "in"
    inp.mkdir()
    r = CliRunner().invoke(main, [*_args(cmd, inp), str(tmp_path / "out.jsonl")])
    assert r.exit_code == 0, r.output
    first = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert (
        first["schema"]
        == {"plan": "claw.job/v1", "score": "claw.outcome/v1", "regrade": "claw.run/v1"}[cmd]
    )


def test_every_output_option_is_checked():
    """Each -o/--output/--plot/--jobs/--runs option of every command uses the output-path check."""
    seen = []
    for name, cmd in main.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and {
                "-o",
                "--output",
                "--plot",
                "--jobs",
                "--runs",
            } & set(p.opts):
                if (name, p.name) == ("trials", "runs_path"):
                    continue  # an input: the runs the outcomes were scored from
                seen.append(name)
                assert p.callback is output_path, f"{name} {p.opts}"
    assert sorted(seen) == [
        "expert",
        "plan",
        "regrade",
        "report",
        "rollouts",
        "rollouts",
        "rollouts",
        "score",
        "trials",
    ]
