"""`claw-bench report` on a mixed public suite: mean reward, pass rate at two thresholds, Pass@k, per harness."""

from __future__ import annotations

import json

import pytest
from claw_bench import load_suite, report, write_records
from claw_bench.cli import main
from click.testing import CliRunner
from test_public_e2e import PUBLIC, run_task, solution

PARTIAL = {
    "cg-csv-totals": "mkdir -p output && printf 'region,total\\n' > output/totals.csv",  # 2 of 4 checks
    "tb-fix-config": "printf 'name = demo\\nport = 8080\\n' > app.ini",
}  # 2 of 3 checks


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Two harnesses x two samples on a ClawGym and a Harbor task: 'solver' always solves, 'partial' half the time."""
    tmp = tmp_path_factory.mktemp("mixed")
    tasks = [
        load_suite(PUBLIC / "clawgym").get("cg-csv-totals"),
        load_suite(PUBLIC / "harbor").get("tb-fix-config"),
    ]
    outs = []
    for task in tasks:
        for k in range(2):
            outs.append(run_task(task, tmp, solution(task), harness="solver"))
            outs.append(
                run_task(task, tmp, solution(task) if k else PARTIAL[task.id], harness="partial")
            )
    for o in outs:
        o.pop("_workspace")
    return outs


def test_report_mean_reward_pass_rates_and_passk(outcomes):
    """Per harness: the continuous mean reward, pass rate at 0.5 and 1.0, Pass@1 and Pass@2."""
    rep = report(outcomes, ks=[1, 2], thresholds=[0.5, 1.0], rounds=200)
    rows = {h["harness"]: h for h in rep["harnesses"]}
    assert (
        rows["solver"]["mean_reward"] == pytest.approx(1.0)
        and rows["solver"]["pass@1"]["value"] == 1.0
    )
    p = rows["partial"]
    assert p["mean_reward"] == pytest.approx((0.5 + 1 + 2 / 3 + 1) / 4)
    assert (p["pass_rate@0.5"], p["pass_rate@1"], p["pass_rate"]) == (1.0, 0.5, 0.5)
    assert p["pass@1"]["value"] == pytest.approx(0.5) and p["pass@2"]["value"] == pytest.approx(1.0)
    task_rows = {(t["harness"], t["task"]): t for t in rep["tasks"]}
    assert task_rows[("partial", "tb-fix-config")]["mean_reward"] == pytest.approx((2 / 3 + 1) / 2)


def test_report_cli_prints_thresholds_side_by_side(outcomes, tmp_path):
    """The CLI table shows reward, pass_rate and pass_rate@T columns; --json carries the same numbers."""
    path = tmp_path / "outcomes.jsonl"
    write_records(path, outcomes)
    r = CliRunner().invoke(
        main,
        [
            "report",
            str(path),
            "--reward-cutoff",
            "0.5",
            "--reward-cutoff",
            "1",
            "-k",
            "1",
            "-k",
            "2",
            "--rounds",
            "200",
        ],
    )
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[0].split()
    assert head[:9] == [
        "harness",
        "tasks",
        "samples",
        "infra_err",
        "unscored",
        "reward",
        "pass_rate",
        "pass_rate@0.5",
        "pass_rate@1",
    ]
    partial = next(ln for ln in r.output.splitlines() if ln.startswith("partial "))
    assert partial.split()[5:9] == ["0.792", "0.500", "1.000", "0.500"]
    js = CliRunner().invoke(
        main, ["report", str(path), "--reward-cutoff", "0.5", "--json", "--rounds", "200"]
    )
    assert json.loads(js.output)["thresholds"] == [0.5]


def test_score_cli_judge_options(tmp_path):
    """score --judge-url needs --judge-model, and an unset --judge-key-env is refused."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("")
    r = CliRunner().invoke(main, ["score", str(runs), "--judge-url", "http://127.0.0.1:9/v1"])
    assert r.exit_code != 0 and "--judge-url needs --judge-model" in r.output
    r = CliRunner().invoke(
        main,
        [
            "score",
            str(runs),
            "--judge-url",
            "http://127.0.0.1:9/v1",
            "--judge-model",
            "m",
            "--judge-key-env",
            "CLAW_TEST_SURELY_UNSET_VAR",
        ],
    )
    assert r.exit_code != 0 and "CLAW_TEST_SURELY_UNSET_VAR: the variable is not set" in r.output


def test_plan_cli_public_options(tmp_path, secret_file):
    """plan loads a public suite with --pass-threshold / --checker-timeout / --workspace-dir applied to its jobs."""
    r = CliRunner().invoke(
        main,
        [
            "plan",
            "--suite",
            str(PUBLIC / "clawgym"),
            "--harness",
            "claw-agent-chat",
            "--proxy",
            "http://127.0.0.1:8000",
            "--proxy-secret-file",
            str(secret_file),
            "--pass-threshold",
            "0.5",
            "--checker-timeout",
            "7",
            "--workspace-dir",
            "/ws",
        ],
    )
    assert r.exit_code == 0, r.output
    jobs = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    assert len(jobs) == 4 and {j["meta"]["pass_threshold"] for j in jobs} == {0.5}
    cfg = json.loads(jobs[0]["verify"]["files"][".claw_verify/runner.json"])
    assert (cfg["timeout_s"], cfg["workspace_dir"], cfg["threshold"]) == (7.0, "/ws", 0.5)
    r = CliRunner().invoke(
        main,
        [
            "plan",
            "--suite",
            str(PUBLIC / "harbor"),
            "--harness",
            "claw-agent-chat",
            "--proxy",
            "http://127.0.0.1:8000",
            "--proxy-secret-file",
            str(secret_file),
            "--cpus",
            "2",
        ],
    )
    [tb] = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    assert tb["limits"] == {"cpus": 2.0, "memory_mb": 512} and tb["image"].startswith(
        "claw-harbor/tb-fix-config:"
    )
    hybrid = next(j for j in jobs if j["meta"]["task"] == "cg-meeting-notes")
    assert (
        hybrid["meta"]["judge"]["weights"]["llm_judge"] == 0.3
        and ".claw_verify/judge_files.json" in hybrid["collect"]
    )
