"""The CLI commands: listings, JSONL in/out, and bad input turned into clear errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from claw_bench import load_suite
from claw_bench.cli import main
from click.testing import CliRunner

DATA = Path(__file__).parent / "data" / "outcomes_handmade.jsonl"


def _run(args, input=None):
    return CliRunner().invoke(main, args, input=input)


def test_tasks_and_harnesses_listings():
    """`tasks` lists the suite (JSON with --json); `harnesses` says which harness is installed."""
    r = _run(["tasks", "--suite", "claw-toy", "--json"])
    assert r.exit_code == 0
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert {x["id"] for x in rows} >= {"toy-hello", "toy-yes"} and all(
        x["has_solution"] for x in rows
    )
    r = _run(["harnesses"])
    assert r.exit_code == 0
    lines = {x.split()[0]: x for x in r.stdout.splitlines()}
    assert (
        "installed" in lines["claw-agent-chat"]
        and "not installed (needs claude)" in lines["claude-code"]
    )


def test_plan_to_stdout_and_missing_secret(tmp_path):
    """`plan` writes jobs to stdout; a missing secret file is a clear error."""
    secret = tmp_path / "s"
    secret.write_text("k")
    args = [
        "plan",
        "-s",
        "claw-toy",
        "-H",
        "claw-agent-text",
        "-n",
        "2",
        "--proxy",
        "http://127.0.0.1:8000",
    ]
    r = _run([*args, "--proxy-secret-file", str(secret), "--memory-mb", "512", "--pids", "64"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[0])["limits"] == {"memory_mb": 512, "pids": 64}
    n_tasks = len(load_suite("claw-toy").tasks)
    assert [json.loads(x)["schema"] for x in r.stdout.splitlines()] == ["claw.job/v1"] * (
        2 * n_tasks
    )
    r = _run([*args, "--proxy-secret-file", str(tmp_path / "nope")])
    assert r.exit_code != 0 and "cannot read the proxy secret" in r.output


def test_score_names_the_bad_line(tmp_path):
    """`score` rejects a malformed line or another record type with file:line."""
    bad = tmp_path / "runs.jsonl"
    bad.write_text(
        '{"schema": "claw.run/v1", "job_id": "j", "status": "infra_error", "meta": {"session": "s", "task": "t", "harness": "h"}}\n{oops\n'
    )
    r = _run(["score", str(bad)])
    assert r.exit_code != 0 and f"{bad}:2: not JSON" in r.output
    bad.write_text('{"schema": "claw.run/v2"}\n')
    r = _run(["score", str(bad)])
    assert "unsupported version 'claw.run/v2'" in r.output


def test_score_from_stdin():
    """`score` reads runs from stdin and writes outcomes to stdout (infra errors stay infra errors)."""
    run = {
        "schema": "claw.run/v1",
        "job_id": "j",
        "status": "infra_error",
        "error": "no bwrap",
        "meta": {"session": "s", "task": "t", "harness": "h"},
    }
    r = _run(["score"], input=json.dumps(run) + "\n")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["status"] == "infra_error" and out["reward"] is None and out["error"] == "no bwrap"


def test_report_text_compare_and_plot(tmp_path):
    """`report` prints tables; --compare prints before/after/delta; --plot writes a PNG."""
    r = _run(["report", str(DATA), "-k", "1", "-k", "2", "--plot", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    assert "pass@2 (95% CI)" in r.stdout and (tmp_path / "p.png").is_file()
    r = _run(["report", str(DATA), "--compare", str(DATA), "--no-tasks"])
    assert r.exit_code == 0 and "pass@1 before" in r.stdout and "+0.0" in r.stdout


def test_report_plot_names_the_file_it_writes(tmp_path):
    """--plot NAME without an extension writes NAME.png, and the message names NAME.png."""
    pytest.importorskip("matplotlib", reason="claw-bench[plot] not installed")
    r = _run(["report", str(DATA), "--plot", str(tmp_path / "passk")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "passk.png").is_file() and not (tmp_path / "passk").exists()
    assert f"wrote {tmp_path / 'passk.png'}" in r.stderr


@pytest.mark.other_clis
def test_check_command_on_a_few_tasks():
    """`check` proves tasks sound in claw-sandbox and prints one JSON line per mode."""
    if (
        shutil.which("claw-sandbox") is None
        and not (Path(sys.executable).parent / "claw-sandbox").exists()
    ):
        pytest.skip("claw-sandbox is not installed: check runs tasks only in the sandbox")
    r = _run(["check", "-s", "claw-toy", "--task", "toy-yes"])
    assert r.exit_code == 0
    modes = [(json.loads(x)["mode"], json.loads(x)["passed"]) for x in r.stdout.splitlines()]
    assert modes == [("untouched", False), ("solution", True)]
