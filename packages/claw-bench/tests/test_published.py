"""Suites as published: bad tasks skipped, binary files, task.toml fields, PinchBench checkouts,
the built-in oracle / nothing harnesses, plan --network, and harnesses that cannot start."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _bench_schemas import validate
from bench_testlib import SECRET, run_job
from claw_bench import TaskError, load_harness, load_suite, plan_jobs, score_run
from claw_bench.cli import main
from claw_bench.errors import PlanError
from click.testing import CliRunner

HB = Path(__file__).parent / "fixtures" / "issue16" / "harbor"
GOOD = ["claw-fixtures-checksum", "hb-no-solution", "hb-tarball", "hb-workdir-app"]


def _run_all(jobs: list[dict], tmp_path: Path) -> list[dict]:
    outs = []
    for job in jobs:
        validate(job, "job")
        run = run_job(job, tmp_path / "runs")
        outs.append(score_run(run))
        validate(outs[-1], "outcome")
    return outs


def test_harbor_suite_skips_the_broken_task_and_strict_refuses_it():
    """A task that does not load is skipped with its path and reason; strict makes it an error."""
    s = load_suite(HB)
    assert sorted(t.id for t in s.tasks) == GOOD
    ((path, reason),) = s.skipped
    assert path.endswith("hb-broken") and "task.toml: invalid TOML" in reason
    with pytest.raises(TaskError, match=r"hb-broken.*invalid TOML"):
        load_suite(HB, strict=True)


def test_tasks_command_warns_once_and_counts():
    """`claw-bench tasks` lists the good tasks, warns about the bad one, ends with N loaded, M skipped."""
    r = CliRunner().invoke(main, ["tasks", "--suite", str(HB)])
    assert r.exit_code == 0, r.output
    assert sorted(line.split()[0] for line in r.stdout.splitlines()) == GOOD
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "hb-broken" in warnings[0] and "invalid TOML" in warnings[0]
    assert r.stderr.splitlines()[-1] == "4 loaded, 1 skipped"
    r = CliRunner().invoke(main, ["tasks", "--suite", str(HB), "--strict"])
    assert r.exit_code != 0 and "hb-broken" in r.output


def test_task_toml_fields_and_binary_files_are_kept():
    """[task] name is the id; allow_internet and the env tables are read; binary tests travel exact."""
    t = load_suite(HB).get("claw-fixtures-checksum")
    assert t.meta["allow_internet"] is False and t.meta["env"] == {"GREETING": "hello"}
    assert t.meta["solution_env"] == {"SOLVE_MODE": "reference"}
    assert t.meta["limits"] == {
        "cpus": 1.0,
        "memory_mb": 512,
        "disk_mb": 256,
    }  # storage_mb is disk_mb
    blob = (HB / "hb-checksum" / "tests" / "data" / "blob.bin").read_bytes()
    assert t.hidden["tests/data/blob.bin"] == blob
    assert sorted(t.solution_files) == ["notes.md", "solve.sh", "write_report.py"]
    (job,) = plan_jobs([t], [load_harness("nothing")], samples=1)
    tests = job["verify"]["mounts"][0]
    assert job["verify"]["reset"] == ["/logs/verifier"]  # emptied before the verifier runs
    assert (
        tests["target"] == "/tests"
        and base64.b64decode(tests["files"]["data/blob.bin"]["content_b64"]) == blob
    )
    assert job["env"] == {"GREETING": "hello"} and job["network"] == {"policy": "none"}


def test_gpu_task_and_malformed_multistep_task_are_skipped_clearly(tmp_path):
    """A task needing GPUs is skipped with a reason that says so; so is a multi-step task whose
    task.toml lists no [[steps]] for its steps/ folder."""
    gpu = tmp_path / "s" / "gpu-task"
    shutil.copytree(HB / "hb-tarball", gpu)
    (gpu / "task.toml").write_text("[environment]\ngpus = 1\n")
    multi = tmp_path / "s" / "multi"
    (multi / "steps" / "one" / "tests").mkdir(parents=True)
    (multi / "task.toml").write_text('version = "1.0"\n')
    shutil.copytree(HB / "hb-tarball", tmp_path / "s" / "ok")
    s = load_suite(tmp_path / "s")
    assert [t.id for t in s.tasks] == ["ok"]
    reasons = dict(s.skipped)
    assert "needs 1 GPU(s)" in reasons[str(gpu)]
    assert "a steps/ folder needs [[steps]] entries" in reasons[str(multi)]
    with pytest.raises(TaskError, match=r"needs \[\[steps\]\]"):
        load_suite(multi)


PB_TASK = """---
id: {id}
name: {id}
grading_type: automated
---
## Prompt
Write hello to out.txt.

## Automated Checks
```python
def grade(transcript, workspace_path):
    return {{"ok": 1.0}}
```
"""


def _pinchbench_checkout(root: Path, manifest: list[str] | None) -> Path:
    (root / "tasks").mkdir(parents=True)
    (root / "assets").mkdir()
    (root / "SKILL.md").write_text("---\nname: pinchbench\n---\n# The skill\n")
    (root / "tasks" / "TASK_TEMPLATE.md").write_text(PB_TASK.format(id="template"))
    for tid in ("task_a", "task_b"):
        (root / "tasks" / f"{tid}.md").write_text(PB_TASK.format(id=tid))
    (root / "tasks" / "task_bad.md").write_text("---\nid: bad\n---\n## Prompt\nx\n")
    if manifest is not None:
        (root / "tasks" / "manifest.yaml").write_text(
            "tasks:\n" + "".join(f"  - {m}\n" for m in manifest)
        )
    return root


def test_pinchbench_checkout_root_and_manifest(tmp_path):
    """A checkout root with SKILL.md loads tasks/task_*.md (no template); manifest.yaml picks and orders."""
    s = load_suite(_pinchbench_checkout(tmp_path / "a", None))
    assert [t.id for t in s.tasks] == ["task_a", "task_b"]
    assert [Path(p).name for p, _ in s.skipped] == [
        "task_bad.md"
    ] and "missing checker" in s.skipped[0][1]
    s = load_suite(_pinchbench_checkout(tmp_path / "b", ["task_b", "task_a", "task_gone"]))
    assert [t.id for t in s.tasks] == ["task_b", "task_a"]
    assert len(s.skipped) == 1 and "'task_gone' names no file" in s.skipped[0][1]
    assert [t.id for t in load_suite(tmp_path / "a" / "tasks").tasks] == ["task_a", "task_b"]


def test_multi_session_pinchbench_task_loads_with_all_its_prompts(tmp_path):
    """A PinchBench task with sessions[] loads with every prompt in order (none dropped); a bad
    sessions entry is skipped with the field named."""
    root = _pinchbench_checkout(tmp_path / "c", None)
    text = PB_TASK.format(id="task_multi").replace(
        "grading_type: automated\n",
        "grading_type: automated\n"
        "sessions:\n  - id: one\n    prompt: first\n  - prompt: second\n"
        "  - prompt: third\n    new_session: true\n",
    )
    (root / "tasks" / "task_multi.md").write_text(text)
    (root / "tasks" / "task_badsess.md").write_text(
        text.replace("task_multi", "task_badsess").replace(
            "    new_session: true", "    new_session: 2"
        )
    )
    s = load_suite(root)
    t = s.get("task_multi")
    assert t.meta["sessions"] == [
        {"id": "one", "prompt": "first", "new_session": False},
        {"id": "session_2", "prompt": "second", "new_session": False},
        {"id": "session_3", "prompt": "third", "new_session": True},
    ]
    assert "first" in t.instruction and "third" in t.instruction
    reasons = {Path(p).name: r for p, r in s.skipped}
    assert "sessions[2].new_session" in reasons["task_badsess.md"]


def test_oracle_passes_nothing_fails_without_a_proxy(tmp_path):
    """plan oracle + nothing with --network none: oracle 1.0 where a solution exists, not scorable where not."""
    s = load_suite(HB)
    jobs = plan_jobs(
        list(s.tasks),
        [load_harness("oracle"), load_harness("nothing")],
        samples=1,
        network="none",
        run_id="r",
    )
    assert all(
        j["network"] == {"policy": "none"} and "ANTHROPIC_BASE_URL" not in j["env"] for j in jobs
    )
    got = {
        (o["task"], o["harness"]): (o["status"], o["reward"], o["passed"])
        for o in _run_all(jobs, tmp_path)
    }
    assert got == {
        ("claw-fixtures-checksum", "oracle"): ("ok", 1.0, True),
        ("claw-fixtures-checksum", "nothing"): ("ok", 0.0, False),
        ("hb-tarball", "oracle"): ("ok", 1.0, True),
        ("hb-workdir-app", "oracle"): ("ok", 1.0, True),
        ("hb-workdir-app", "nothing"): ("ok", 0.0, False),
        ("hb-tarball", "nothing"): ("ok", 0.0, False),
        ("hb-no-solution", "oracle"): ("not_scorable", None, None),
        ("hb-no-solution", "nothing"): ("ok", 0.0, False),
    }


def test_oracle_runs_claw_tasks_reference_solution(tmp_path):
    """On a claw task the oracle runs solution.sh / .py and passes; nothing fails."""
    tasks = list(load_suite("claw-toy").select(["toy-hello", "toy-yes"]).tasks)
    jobs = plan_jobs(
        tasks, [load_harness("oracle"), load_harness("nothing")], samples=1, run_id="c"
    )
    outs = _run_all(jobs, tmp_path)
    assert [(o["harness"], o["passed"]) for o in outs] == [("oracle", True), ("nothing", False)] * 2


def test_network_choice_and_allow_internet(tmp_path):
    """Model harnesses default to proxy and need --proxy; internet is host; allow_internet=false wins."""
    t = load_suite(HB).get("claw-fixtures-checksum")
    other = load_suite(HB).get("hb-tarball")
    chat = load_harness("claw-agent-chat")
    with pytest.raises(PlanError, match="--proxy and --proxy-secret-file are needed"):
        plan_jobs([t], [chat], samples=1)
    with pytest.raises(PlanError, match="--network none"):
        plan_jobs(
            [t], [chat], samples=1, proxy_url="http://127.0.0.1:8000", secret=SECRET, network="none"
        )
    (j,) = plan_jobs([other], [chat], samples=1, proxy_url="http://127.0.0.1:8000", secret=SECRET)
    assert j["network"] == {"policy": "proxy", "proxy_url": "http://127.0.0.1:8000", "port": 8000}
    jobs = plan_jobs(
        [other, t],
        [chat, load_harness("oracle")],
        samples=1,
        proxy_url="http://10.0.0.2:8000",
        secret=SECRET,
        network="host",
    )
    nets = {(j["meta"]["task"], j["meta"]["harness"]): j["network"]["policy"] for j in jobs}
    assert nets == {
        ("hb-tarball", "claw-agent-chat"): "host",
        ("hb-tarball", "oracle"): "host",
        ("claw-fixtures-checksum", "claw-agent-chat"): "proxy",
        ("claw-fixtures-checksum", "oracle"): "none",
    }
    assert jobs[0]["env"]["OPENAI_BASE_URL"].startswith("http://10.0.0.2:8000")


def test_plan_cli_oracle_needs_no_proxy(tmp_path):
    """`plan --harness oracle --network none` works without --proxy; a model harness without it is a usage error."""
    out = tmp_path / "jobs.jsonl"
    r = CliRunner().invoke(
        main,
        [
            "plan",
            "-s",
            str(HB),
            "-H",
            "oracle",
            "-H",
            "nothing",
            "--network",
            "none",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 8 and "warning: skipped" in r.stderr
    r = CliRunner().invoke(main, ["plan", "-s", str(HB), "-H", "claw-agent-chat"])
    assert r.exit_code == 2 and "give --proxy and --proxy-secret-file" in r.output


def test_harness_exit_127_is_a_failed_rollout_and_only_the_sandbox_says_it_did_not_start(tmp_path):
    """A harness whose executable is missing: the job's own guard exits 127 with the reason, and
    that exit code (which any agent can produce) scores as a failed rollout, reward 0.0. Only a
    run the sandbox marks `error` (its lookup, before the agent ran, found no such program) is an
    infra_error with reward null."""
    adapter = tmp_path / "ghost.toml"
    adapter.write_text(
        'api = "chat"\nrequires = ["claw-no-such-tool"]\ninstruction = "file"\n'
        'command = "claw-no-such-tool {{instruction_file}}"\n'
    )
    task = load_suite("claw-toy").get("toy-yes")
    (job,) = plan_jobs(
        [task],
        [load_harness(str(adapter))],
        samples=1,
        proxy_url="http://127.0.0.1:9",
        secret=SECRET,
    )
    run = run_job(job, tmp_path / "runs")
    assert run["exit_code"] == 127 and "claw-no-such-tool is not installed" in run["stderr_tail"]
    out = score_run(run)
    assert (out["status"], out["reward"], out["passed"]) == ("ok", 0.0, False), out
    why = "job 'x': command: 'claw-no-such-tool' was not found in the job's environment"
    refused = {**run, "status": "error", "exit_code": None, "verify": None, "error": why}
    out = score_run(refused)
    assert out["status"] == "infra_error" and out["reward"] is None and out["error"] == why


def _flow(tmp_path: Path, backend: str, *extra: str) -> dict:
    """plan --harness oracle --harness nothing --network none -> claw-sandbox run -> score: the outcomes."""
    jobs, runs, outs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl", tmp_path / "outcomes.jsonl"
    r = CliRunner().invoke(
        main,
        [
            "plan",
            "-s",
            str(HB),
            "-H",
            "oracle",
            "-H",
            "nothing",
            "--network",
            "none",
            "-o",
            str(jobs),
        ],
    )
    assert r.exit_code == 0, r.output
    doctor = subprocess.run(
        ["claw-sandbox", "doctor"], capture_output=True, text=True
    ).stdout.splitlines()
    if not any(line.split()[:2] == ["ok", backend] for line in doctor):
        pytest.skip(f"{backend} backend unavailable here (claw-sandbox doctor)")
    p = subprocess.run(
        ["claw-sandbox", "run", str(jobs), "-o", str(runs), "--backend", backend, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    r = CliRunner().invoke(main, ["score", str(runs), "-o", str(outs)])
    assert r.exit_code == 0, r.output
    return {
        "stderr": p.stderr,
        "runs": [json.loads(x) for x in runs.read_text().splitlines()],
        "outcomes": {
            (o["task"], o["harness"]): (o["status"], o["reward"], o["passed"])
            for o in map(json.loads, outs.read_text().splitlines())
        },
    }


def _assert_oracle_passes_nothing_fails(got: dict) -> None:
    for task in GOOD:
        if task == "hb-no-solution":
            assert got[(task, "oracle")] == ("not_scorable", None, None)
        else:
            assert got[(task, "oracle")] == ("ok", 1.0, True), task
        assert got[(task, "nothing")] == ("ok", 0.0, False), task


@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_plan_sandbox_score_flow_without_a_proxy(tmp_path):
    """On bwrap, every fixture (WORKDIR /app, /solution siblings, a test.sh that cd's away and uses
    /tests, binary test data, reward.json): oracle 1.0 and passed, nothing 0; RUN lines warned once."""
    flow = _flow(tmp_path, "bwrap")
    _assert_oracle_passes_nothing_fails(flow["outcomes"])
    assert flow["stderr"].count("does not build images") == 1
    wd = [r for r in flow["runs"] if r["meta"]["task"] == "hb-workdir-app"]
    assert all(
        r["image_run_skipped"] == ['RUN echo "built by the image" > /opt/built.txt'] for r in wd
    )


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_plan_sandbox_score_flow_on_docker(tmp_path):
    """The same flow on docker: task images built from environment/ on a locally imported base
    image (no registry); one container per trial; oracle 1.0, nothing 0."""
    from _fixture_image import BASE_IMAGE, ensure_base_image

    why = ensure_base_image()
    if why:
        pytest.skip(f"no local base image for the fixtures: {why}")
    r = CliRunner().invoke(main, ["images", "--suite", str(HB), "--build"])
    assert r.exit_code == 0, r.output
    flow = _flow(tmp_path, "docker", "--image", BASE_IMAGE)
    _assert_oracle_passes_nothing_fails(flow["outcomes"])
    assert not any(
        r.get("image_run_skipped") for r in flow["runs"]
    )  # docker ran the image's RUN lines


def test_fixture_blob_matches_its_checksum():
    """The binary fixture is what its checksum file says (guards against a text-mode checkout)."""
    d = HB / "hb-checksum" / "tests" / "data"
    assert (
        hashlib.sha256((d / "blob.bin").read_bytes()).hexdigest()
        == (d / "blob.sha256").read_text().strip()
    )
