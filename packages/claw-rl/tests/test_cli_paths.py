"""Output-path mistakes are one-line usage errors (exit 2); a refused train leaves its run as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_rl.cli import main
from click.testing import CliRunner
from rl_testlib import tree_sample

PARENT = [-1, 0, 1, 2, 2, 4]
TRAIN = [0, 0, 1, 1, 1, 1]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")
    }


def _inputs(inp: Path) -> dict[str, Path]:
    inp.mkdir()
    samples = inp / "s.jsonl"
    samples.write_text(
        json.dumps(tree_sample(PARENT, TRAIN, sample_id="a", vocab=2000, returns=True)) + "\n"
    )
    calls = inp / "calls.jsonl"
    calls.write_text(
        json.dumps(
            {
                "schema": "claw.call/v1",
                "call_id": "c0",
                "session": "s",
                "seq": 0,
                "prompt_ids": [5, 6, 7],
                "completion_ids": [40, 41],
                "completion_logprobs": [-1.0, -2.0],
            }
        )
        + "\n"
    )
    return {"values": samples, "logprobs": calls}


def _args(cmd: str, tiny: Path, inputs: dict[str, Path]) -> list[str]:
    flag = "--samples" if cmd == "values" else "--calls"
    return [cmd, "--model", str(tiny), flag, str(inputs[cmd]), "--output"]


@pytest.mark.parametrize("mistake", ["directory", "missing parent"])
@pytest.mark.parametrize("cmd", ["values", "logprobs"])
def test_bad_out_is_a_one_line_usage_error(tiny, tmp_path, cmd, mistake):
    """A directory, or a file in a missing directory, exits 2 with one error line naming it; nothing is written."""
    inputs = _inputs(tmp_path / "in")
    (tmp_path / "work" / "d").mkdir(parents=True)
    target = tmp_path / "work" / ("d" if mistake == "directory" else "missing/sub/out.jsonl")
    before = _tree(tmp_path)
    r = CliRunner().invoke(main, [*_args(cmd, tiny, inputs), str(target)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(target) in errors[0], r.stderr
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("cmd", ["values", "logprobs"])
def test_good_out_still_writes(tiny, tmp_path, cmd):
    """The same arguments with a file in an existing directory run and write that file."""
    inputs = _inputs(tmp_path / "in")
    r = CliRunner().invoke(main, [*_args(cmd, tiny, inputs), str(tmp_path / "out.jsonl")])
    assert r.exit_code == 0, r.output
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert row["sample_id" if cmd == "values" else "call_id"] == ("a" if cmd == "values" else "c0")


def test_refused_train_leaves_the_run_untouched(tiny, tmp_path):
    """train --output over a run whose policy/v1 exists is refused before it writes: config.toml stays byte-identical."""
    samples = _inputs(tmp_path / "in")["values"]
    out = tmp_path / "run"
    args = [
        "train",
        "--algo",
        "ppo",
        "--model",
        str(tiny),
        "--samples",
        str(samples),
        "--output",
        str(out),
    ]
    r = CliRunner().invoke(main, [*args, "--lr", "1e-4"])
    assert r.exit_code == 0, r.output
    before = _tree(out)
    assert "config.toml" in before and "policy/v1/model.safetensors" in before
    r = CliRunner().invoke(main, [*args, "--lr", "5e-4", "--name", "other"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(out / "policy" / "v1") in errors[0], r.stderr
    assert _tree(out) == before
    r = CliRunner().invoke(main, [*args, "--start-version", "1"])
    assert r.exit_code == 0, r.output
    assert (
        json.loads(r.stdout)["version"] == 2
        and (out / "policy" / "v2" / "model.safetensors").is_file()
    )


def _one_error(r, path) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(path) in errors[0], r.stderr


@pytest.mark.parametrize("where", ["under a file", "a file", "read-only parent"])
@pytest.mark.parametrize("cmd", ["train", "sft"])
def test_uncreatable_run_dir_is_a_one_line_error(tiny, tmp_path, monkeypatch, cmd, where):
    """-o naming a file, a path under a file, or a directory in a read-only parent exits 2 with
    one line naming it, before any model loads; nothing is written."""
    from claw_rl.learner import Learner

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the path was checked")

    monkeypatch.setattr(Learner, "from_config", no_model)
    samples = _inputs(tmp_path / "in")["values"]
    (tmp_path / "file").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    out = {
        "under a file": tmp_path / "file" / "run",
        "a file": tmp_path / "file",
        "read-only parent": ro / "run",
    }[where]
    if where == "read-only parent":
        import os

        if os.access(ro, os.W_OK):  # root writes anywhere: permissions cannot refuse it
            pytest.skip("running as root: a mode-0500 directory is writable")
    head = ["train", "--algo", "grpo"] if cmd == "train" else ["sft"]
    r = CliRunner().invoke(
        main, [*head, "--model", str(tiny), "--samples", str(samples), "-o", str(out)]
    )
    _one_error(r, out)
    assert not (tmp_path / "file").is_dir() and list(ro.iterdir()) == []


@pytest.mark.parametrize("cmd", ["train", "sft", "values", "logprobs"])
def test_missing_input_is_reported_before_the_model_loads(tiny, tmp_path, monkeypatch, cmd):
    """A --samples / --calls file that does not exist is a one-line usage error (exit 2) raised
    while the command line is parsed: no model is loaded first."""
    from claw_rl import learner

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input path was checked")

    for name in ("from_config", "ppo", "grpo"):
        monkeypatch.setattr(learner.Learner, name, no_model)
    missing = tmp_path / "nope.jsonl"
    head = {
        "train": ["train", "--algo", "ppo", "-o", str(tmp_path / "run"), "--samples"],
        "sft": ["sft", "-o", str(tmp_path / "run"), "--samples"],
        "values": ["values", "--samples"],
        "logprobs": ["logprobs", "--calls"],
    }[cmd]
    r = CliRunner().invoke(main, [*head, str(missing), "--model", str(tiny)])
    _one_error(r, missing)
    assert not (tmp_path / "run").exists()


def test_malformed_samples_are_reported_before_the_model_loads(tiny, tmp_path, monkeypatch):
    """A samples file with a bad line names file and line, and no model is loaded first."""
    from claw_rl.learner import Learner

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the samples were read")

    monkeypatch.setattr(Learner, "from_config", no_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    args = ["train", "--algo", "grpo", "--model", str(tiny), "--samples", str(bad)]
    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "run")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{bad}:1" in r.stderr, r.stderr
