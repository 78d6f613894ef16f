"""Public-layout tasks end to end: plan -> test runner -> score, untouched / reference / hidden files / bad checkers."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from _bench_schemas import validate
from bench_testlib import SECRET, run_job
from claw_bench import load_harness, load_suite, plan_jobs, score_run
from claw_bench.loaders import Judge, LoadOptions, load_public
from claw_bench.loaders.transcript import TRANSCRIPT_FILE, transcript_from_calls

PUBLIC = Path(__file__).parent / "fixtures" / "public"
SUITES = {
    "clawgym": PUBLIC / "clawgym",
    "pinchbench": PUBLIC / "pinchbench" / "tasks",
    "harbor": PUBLIC / "harbor",
}


def agent(tmp_path: Path, name: str = "test-agent"):
    """A harness adapter for the test agent (its command is replaced by a fixed shell command)."""
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\napi = "chat"\nrequires = []\ninstruction = "file"\ncommand = "cat {{{{instruction_file}}}}"\n'
    )
    return load_harness(str(p))


def collect(ws: Path, globs: list[str]) -> dict[str, str]:
    """What the sandbox's ``collect`` would bring back (read after verify)."""
    out: dict[str, str] = {}
    for g in globs:
        for p in sorted(ws.glob(g)) if g != "**" else sorted(ws.rglob("*")):
            if p.is_file():
                out[p.relative_to(ws).as_posix()] = p.read_text(errors="replace")
    return out


def run_task(
    task,
    tmp_path: Path,
    command: str,
    *,
    judge: Judge | None = None,
    threshold: float | None = None,
    extra_verify_files: dict[str, str] | None = None,
    harness: str = "test-agent",
) -> dict[str, Any]:
    """Plan one job of ``task`` for a test agent running ``command``, run it, score it; the outcome."""
    run = run_only(task, tmp_path, command, extra_verify_files=extra_verify_files, harness=harness)
    out = score_run(run, judge=judge, threshold=threshold)
    validate(out, "outcome")
    out["_workspace"] = run["_workspace"]
    return out


def run_only(
    task,
    tmp_path: Path,
    command: str,
    *,
    extra_verify_files: dict[str, str] | None = None,
    harness: str = "test-agent",
) -> dict[str, Any]:
    """Plan one job of ``task`` for a test agent running ``command`` and run it; the claw.run/v1 dict."""
    job = plan_jobs(
        [task],
        [agent(tmp_path, harness)],
        samples=1,
        proxy_url="http://127.0.0.1:9",
        secret=SECRET,
        run_id=f"r{time.monotonic_ns()}",
    )[0]
    job["command"] = command
    job["verify"].setdefault("files", {}).update(extra_verify_files or {})
    validate(job, "job")
    root = tmp_path / "runs"
    run = run_job(job, root)
    if job.get("profile") != "harbor":  # a Harbor-profile run collects its absolute paths itself
        run["collected"] = collect(root / job["job_id"], job["collect"])
    validate(run, "run")
    run["_workspace"] = str(root / job["job_id"])
    return run


def solution(task) -> str:
    """The reference solution: the task's own (Harbor's solution/solve.sh) or the fixture's."""
    return (
        task.solution.text
        if task.solution
        else (PUBLIC / "solutions" / f"{task.id}.sh").read_text()
    )


def fixed_judge(score: float) -> Judge:
    """A judge endpoint (OpenAI chat shape, in-process) that always answers ``score``."""

    def handler(request: httpx.Request) -> httpx.Response:
        text = f'The work matches the rubric.\n{{"score": {score}, "reasoning": "fixed"}}'
        return httpx.Response(
            200, json={"choices": [{"message": {"role": "assistant", "content": text}}]}
        )

    return Judge(
        base_url="http://judge.test/v1", model="judge-1", transport=httpx.MockTransport(handler)
    )


ALL = [(layout, t.id) for layout, d in SUITES.items() for t in load_suite(d).tasks]


@pytest.mark.parametrize(("layout", "task_id"), ALL)
def test_untouched_scores_low_and_reference_scores_one(tmp_path, layout, task_id):
    """Every fixture: the untouched workspace scores 0 and fails; the reference solution scores 1.0 and passes."""
    task = load_suite(SUITES[layout]).get(task_id)
    judge = fixed_judge(1.0) if task.meta.get("judge") else None
    low = run_task(task, tmp_path, "true", judge=fixed_judge(0.0) if judge else None)
    assert low["status"] == "ok" and low["reward"] < 0.5 and low["passed"] is False
    good = run_task(task, tmp_path, solution(task), judge=judge)
    assert good["status"] == "ok", good
    assert good["reward"] == pytest.approx(1.0) and good["passed"] is True, good["details"]


def test_sub_scores_are_kept_in_the_outcome(tmp_path):
    """A ClawGym checker's named 0/1 sub-scores land in the outcome's details; partial work gets partial credit."""
    task = load_suite(SUITES["clawgym"]).get("cg-csv-totals")
    out = run_task(
        task, tmp_path, "mkdir -p output && printf 'region,total\\n' > output/totals.csv"
    )
    d = out["details"]
    assert (
        d["totals_exists"],
        d["totals_header"],
        d["totals_values"],
        d["summary_top_region"],
    ) == (1.0, 1.0, 0.0, 0.0)
    assert out["reward"] == pytest.approx(0.5) and out["passed"] is False
    assert (
        run_task(
            task,
            tmp_path,
            "mkdir -p output && printf 'region,total\\n' > output/totals.csv",
            threshold=0.5,
        )["passed"]
        is True
    )


@pytest.mark.parametrize("layout", sorted(SUITES))
def test_agent_never_sees_hidden_checker_files(tmp_path, layout):
    """A test agent that lists the workspace (ls -laR) never sees reward/, tests/ or the verify folder."""
    for task in load_suite(SUITES[layout]).tasks:
        out = run_task(
            task, tmp_path, "ls -laR > listing.txt && cat reward/* tests/* > peek.txt 2>&1; true"
        )
        ws = Path(out["_workspace"])
        listing = (ws / "listing.txt").read_text()
        for hidden in (
            "reward",
            "tests",
            ".claw_verify",
            "check.py",
            "test.sh",
            "grade.py",
            "runner",
        ):
            assert hidden not in listing, (task.id, hidden)
        assert "No such file" in (ws / "peek.txt").read_text()
        assert not (ws / "reward").exists(), "the ClawGym reward/ folder is removed after verifying"


def _broken(tmp_path: Path, name: str, check_py: str) -> Path:
    d = tmp_path / name
    shutil.copytree(SUITES["clawgym"] / "cg-meeting-notes", d)
    entry = json.loads((d / "data_entry.json").read_text())
    entry["task_id"] = name
    entry["metadata"].pop("rules")
    (d / "data_entry.json").write_text(json.dumps(entry))
    (d / "reward" / "check.py").write_text(check_py)
    return d


@pytest.mark.parametrize(
    ("check_py", "reason"),
    [
        (
            "raise RuntimeError('checker bug')\n",
            "checker exited with code 1: .*RuntimeError: checker bug",
        ),
        (
            "print('all good, trust me')\n",
            "last stdout line is not a reward in \\[0, 1\\]: 'all good, trust me'",
        ),
        (
            "print('{\"a\": 1}')\nprint(3.5)\n",
            "last stdout line is not a reward in \\[0, 1\\]: '3.5'",
        ),
        ("pass\n", "checker printed nothing"),
    ],
)
def test_crashing_or_garbage_checker_scores_zero_with_reason(tmp_path, check_py, reason):
    """A checker that crashes or prints garbage gives reward 0 (status ok, not passed) with the reason recorded."""
    task = load_public(_broken(tmp_path, "broken", check_py))[0]
    out = run_task(task, tmp_path, solution(load_suite(SUITES["clawgym"]).get("cg-meeting-notes")))
    assert (out["status"], out["reward"], out["passed"]) == ("ok", 0.0, False)
    assert re.search(reason, out["details"]["reason"], re.S), out["details"]


def test_clawgym_checker_with_only_grade_is_called_with_empty_transcript(tmp_path):
    """A ClawGym check.py that only defines grade(transcript, workspace_path) is called as grade([], workspace)."""
    d = tmp_path / "cg-grade-only"
    shutil.copytree(SUITES["clawgym"] / "cg-csv-totals", d)
    (d / "reward" / "reward.sh").unlink()
    check = d / "reward" / "check.py"
    check.write_text(check.read_text().split('if __name__ == "__main__":')[0])
    task = load_public(d)[0]
    assert (
        json.loads(task.verify_files()[".claw_verify/runner.json"])["grade_file"]
        == "reward/check.py"
    )
    assert run_task(task, tmp_path, "true")["reward"] == 0.0
    good = run_task(task, tmp_path, solution(task))
    assert good["reward"] == 1.0 and good["details"]["summary_top_region"] == 1.0


def test_hanging_checker_is_killed_at_its_timeout(tmp_path):
    """A checker that hangs (and leaves a child behind) is killed at the checker timeout: reward 0, reason recorded."""
    d = _broken(
        tmp_path,
        "hangs",
        "import subprocess, time\nsubprocess.Popen(['sleep', '120'])\ntime.sleep(120)\n",
    )
    task = load_public(d, LoadOptions(checker_timeout_s=1.0))[0]
    started = time.monotonic()
    out = run_task(task, tmp_path, "true")
    assert time.monotonic() - started < 20
    assert (out["status"], out["reward"], out["passed"]) == ("ok", 0.0, False)
    assert out["details"]["checker_timed_out"] is True
    assert "killed at its timeout (1s)" in out["details"]["reason"]


def test_pinchbench_grade_crash_and_bad_values(tmp_path):
    """grade() that raises, or returns values outside [0, 1], scores 0 with the reason."""
    src = (SUITES["pinchbench"] / "task_01_word_stats.md").read_text()
    for body, reason in (
        ("    raise ValueError('oops')\n", "grade() crashed"),
        ("    return {'x': 'yes'}\n", "score 'x' = 'yes' is not a number"),
    ):
        p = tmp_path / "tasks" / "task_09.md"
        p.parent.mkdir(exist_ok=True)
        p.write_text(
            src.replace("id: task_01_word_stats", "id: task_09").replace(
                "    ws = Path(workspace_path)\n", body + "    ws = Path(workspace_path)\n", 1
            )
        )
        task = load_public(p, LoadOptions(assets_dir=str(PUBLIC / "pinchbench" / "assets")))[0]
        out = run_task(
            task, tmp_path, solution(load_suite(SUITES["pinchbench"]).get("task_01_word_stats"))
        )
        assert out["reward"] == 0.0 and reason in out["details"]["reason"], out["details"]


def test_harbor_missing_or_garbage_reward_and_hang(tmp_path):
    """Harbor: no reward file counts 0, a garbage reward.txt counts 0, a hanging test.sh is killed; reasons recorded."""
    cases = [
        ("exit 0\n", "wrote neither reward.txt nor reward.json", {}),
        (
            "echo banana > /logs/verifier/reward.txt\n",
            "reward.txt is not a number in [0, 1]: banana",
            {},
        ),
        ("sleep 60 & wait\n", "killed at its timeout (1s)", {"checker_timeout_s": 1.0}),
    ]
    for i, (script, reason, opts) in enumerate(cases):
        d = tmp_path / f"tb-{i}"
        shutil.copytree(SUITES["harbor"] / "tb-fix-config", d)
        (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + script)
        task = load_public(d, LoadOptions(**opts))[0]
        started = time.monotonic()
        out = run_task(task, tmp_path, solution(task))
        assert time.monotonic() - started < 20
        assert (out["reward"], out["passed"]) == (0.0, False) and reason in out["details"][
            "reason"
        ], out["details"]


def test_transcript_from_proxy_calls_reaches_grade(tmp_path):
    """The session's calls (claw.call/v1 with raw bodies) become grade()'s transcript; without them grade() gets []."""
    calls = [
        {
            "schema": "claw.call/v1",
            "session": "s1",
            "seq": 0,
            "api": "openai.chat",
            "request": {"messages": [{"role": "user", "content": "Write stats.json"}]},
            "response": {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {
                                        "name": "read",
                                        "arguments": '{"path": "story.txt"}',
                                    },
                                }
                            ],
                        }
                    }
                ]
            },
        },
        {
            "schema": "claw.call/v1",
            "session": "other",
            "seq": 5,
            "api": "openai.chat",
            "request": {"messages": [{"role": "user", "content": "unrelated"}]},
        },
    ]
    transcript = transcript_from_calls(calls, "s1")
    assert transcript[-1]["message"]["content"][0] == {
        "type": "toolCall",
        "id": "c1",
        "name": "read",
        "arguments": {"path": "story.txt"},
    }
    task = load_suite(SUITES["pinchbench"]).get("task_01_word_stats")
    with_t = run_task(
        task, tmp_path, solution(task), extra_verify_files={TRANSCRIPT_FILE: json.dumps(transcript)}
    )
    assert (
        with_t["details"]["read_story"] == 1.0
        and with_t["details"]["transcript"] == "transcript.json"
    )
    without = run_task(task, tmp_path, solution(task))
    assert "read_story" not in without["details"] and without["details"]["transcript"] == "empty"


def test_regrade_hands_the_proxy_transcript_to_grade(tmp_path):
    """`claw-bench regrade` re-runs grade() on the run's workspace snapshot with the session's calls as transcript."""
    from claw_bench import read_records, write_records
    from claw_bench.cli import main
    from click.testing import CliRunner

    task = load_suite(SUITES["pinchbench"]).get("task_01_word_stats")
    run = run_only(task, tmp_path, solution(task))
    run.pop("_workspace")
    session = run["meta"]["session"]
    calls = [
        {
            "schema": "claw.call/v1",
            "session": session,
            "seq": 0,
            "api": "anthropic.messages",
            "request": {
                "system": "You are an agent",
                "messages": [{"role": "user", "content": "go"}],
            },
            "response": {
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "story.txt"}}
                ]
            },
        }
    ]
    write_records(tmp_path / "runs.jsonl", [run])
    write_records(tmp_path / "calls.jsonl", calls)
    r = CliRunner().invoke(
        main,
        [
            "regrade",
            str(tmp_path / "runs.jsonl"),
            "--suite",
            str(SUITES["pinchbench"]),
            "--calls",
            str(tmp_path / "calls.jsonl"),
            "-o",
            str(tmp_path / "regraded.jsonl"),
        ],
    )
    assert r.exit_code == 0, r.output
    [new] = read_records(tmp_path / "regraded.jsonl", "claw.run/v1")
    validate(new, "run")
    out = score_run(new)
    assert (
        out["details"]["read_story"] == 1.0
        and out["reward"] == 1.0
        and new["meta"]["regraded"]["transcript_events"] == 3
    )
    assert score_run(run)["details"]["transcript"] == "empty"
    calls[0]["response"]["content"][0]["input"] = {"path": "elsewhere.txt"}
    write_records(tmp_path / "calls.jsonl", calls)
    CliRunner().invoke(
        main,
        [
            "regrade",
            str(tmp_path / "runs.jsonl"),
            "--suite",
            str(SUITES["pinchbench"]),
            "--calls",
            str(tmp_path / "calls.jsonl"),
            "-o",
            str(tmp_path / "regraded.jsonl"),
        ],
    )
    again = score_run(read_records(tmp_path / "regraded.jsonl", "claw.run/v1")[0])
    assert again["details"]["read_story"] == 0.0 and again["reward"] == pytest.approx(0.75)


def test_fixed_workspace_dir_is_used_by_checkers_and_instruction(tmp_path):
    """With a configured workspace dir the instruction names it and the runner passes it to the checker."""
    task = load_public(SUITES["clawgym"] / "cg-csv-totals", LoadOptions(workspace_dir="/work/ws"))[
        0
    ]
    assert (
        "/work/ws/input/sales.csv" in task.instruction and "/root/.openclaw" not in task.instruction
    )
    assert (
        json.loads(task.verify_files()[".claw_verify/runner.json"])["workspace_dir"] == "/work/ws"
    )
    default = load_public(SUITES["clawgym"] / "cg-csv-totals")[0]
    assert (
        "`input/sales.csv`" not in default.instruction and " input/sales.csv" in default.instruction
    )
    # the default remaps the mount dir to wherever the workspace is: the reference passes in a temp dir
    assert run_task(default, tmp_path, solution(default))["reward"] == 1.0
    assert attrs.evolve(default).pass_threshold == 1.0


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_through_claw_sandbox(tmp_path):
    """Every fixture through the real claw-sandbox CLI: the listing agent sees no checker files, the reference scores 1.0."""
    import subprocess

    from claw_bench import read_records, write_records

    jobs = []
    for d in SUITES.values():
        for task in load_suite(d).tasks:
            for mode, cmd in (("list", "ls -laR > listing.txt"), ("ref", solution(task))):
                job = plan_jobs(
                    [task],
                    [agent(tmp_path)],
                    samples=1,
                    proxy_url="http://127.0.0.1:9",
                    secret=SECRET,
                    run_id=mode,
                )[0]
                job.update(command=cmd, network={"policy": "none"})
                job["collect"].append("listing.txt")
                jobs.append(job)
    write_records(tmp_path / "jobs.jsonl", jobs)
    subprocess.run(
        ["claw-sandbox", "run", str(tmp_path / "jobs.jsonl"), "-o", str(tmp_path / "runs.jsonl")],
        check=True,
        timeout=600,
    )
    for run in read_records(tmp_path / "runs.jsonl", "claw.run/v1"):
        out = score_run(run, judge=fixed_judge(1.0) if run["meta"].get("judge") else None)
        if run["meta"]["run_id"] == "ref":
            assert (out["status"], out["reward"], out["passed"]) == ("ok", 1.0, True), (
                run["job_id"],
                out,
            )
        else:
            listing = run["collected"]["listing.txt"]
            assert not any(
                h in listing for h in ("reward", "tests", ".claw_verify", "check.py", "grade.py")
            ), listing
