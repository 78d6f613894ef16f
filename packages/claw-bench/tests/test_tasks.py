"""Task directories: the built-in suites are sound, and bad task directories are named clearly."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from bench_testlib import (
    check_task,  # the jobs check plans, run by the test runner (claw-sandbox's is the real one)
)
from claw_bench import TaskError, builtin_suites, load_suite, load_task
from claw_bench.suites import Suite
from claw_bench.tasks import Script, Task, job_files

MINI = load_suite("claw-mini")
TOY = load_suite("claw-toy")
# the generated toy-steps family has its own tests (test_families.py); two instances run here
TOY_HAND = [t for t in TOY.tasks if "toy-steps" not in t.tags]
ALL = [*MINI.tasks, *TOY_HAND, TOY.get("toy-steps-train-0000"), TOY.get("toy-steps-heldout-0000")]
# A few tasks of each kind run in the fast tests; all of them run in the slow ones.
FAST = {
    "organize-by-extension",
    "csv-to-json-people",
    "merge-contacts-dedupe",
    "ini-change-port",
    "meeting-notes-to-json",
    "fix-sum-off-by-one",
    "report-sales-by-region",
    "toy-hello",
}


def _params(tasks):
    return [pytest.param(t, id=t.id, marks=() if t.id in FAST else pytest.mark.slow) for t in tasks]


def test_builtin_suites_are_listed_and_large_enough():
    """claw-mini ships at least 40 tasks, claw-toy a few; every task is documented and has a solution."""
    assert {"claw-mini", "claw-toy"} <= set(builtin_suites())
    assert len(MINI.tasks) >= 40
    assert 3 <= len(TOY_HAND) <= 10
    for t in ALL:
        assert t.solution is not None, t.id
        assert t.tags and t.difficulty in ("easy", "medium", "hard"), t.id
        assert len(t.instruction) > 20, t.id
    kinds = {tag for t in MINI.tasks for tag in t.tags}
    assert {"files", "csv", "json", "merge", "config", "extract", "fix", "report"} <= kinds


@pytest.mark.parametrize("task", _params(ALL))
def test_untouched_fails_and_reference_solution_passes(task):
    """The untouched workspace fails verification; the reference solution passes with reward 1 (or its threshold)."""
    before = check_task(task, "untouched")
    assert before["passed"] is False, before["output"]
    after = check_task(task, "solution")
    assert after["solution_exit_code"] == 0, after.get("solution_output")
    assert after["passed"] is True, after["output"]
    assert after["reward"] >= (task.pass_threshold or 1.0)
    assert after["scores"], "verifiers report named sub-scores"
    assert before["reward"] < after["reward"]


@pytest.mark.parametrize("task", _params(MINI.tasks))
def test_garbage_fails(task, tmp_path):
    """Overwriting every workspace file with garbage (and adding a garbage answer) fails verification."""
    garbage = {rel: "garbage\n" for rel in task.workspace}
    garbage["answer.txt"] = "garbage\n"
    data = {
        f: getattr(task, f)
        for f in ("id", "instruction", "verify", "hidden", "reward_file", "pass_threshold")
    }
    result = check_task(Task(**data, workspace=garbage), "untouched")
    assert result["passed"] is False, result["output"]


def test_hidden_files_never_reach_the_agent_workspace():
    """Verifier, hidden data and solution are not among the files the agent starts with."""
    for t in MINI.tasks:
        names = set(t.workspace)
        assert not any(
            n.startswith(".claw_verify") or "verify" in n or "solution" in n for n in names
        ), t.id
        assert all(k.startswith(".claw_verify/") for k in t.verify_files())


def test_toy_tasks_give_shaped_partial_credit(tmp_path):
    """claw-toy rewards a near miss with partial credit between 0 and 1 (a learnable signal)."""
    base = TOY.get("toy-hello")
    for answer, lo, hi in [
        ("hel", 0.3, 0.99),
        ("help me please", 0.3, 0.99),
        ("hello", 1.0, 1.0),
        ("zzz", 0.2, 0.6),
    ]:
        t = Task(
            id=base.id,
            instruction=base.instruction,
            verify=base.verify,
            pass_threshold=base.pass_threshold,
            solution=Script(
                name="solution.sh", text=f"printf '{answer}' > answer.txt\n", interpreter="bash"
            ),
        )
        r = check_task(t, "solution")
        assert lo <= r["reward"] <= hi, (answer, r)
        assert r["passed"] is (answer == "hello")


def _write_task(
    root: Path,
    toml: str | None = 'id = "t1"\ninstruction = "do it"\n',
    verify: str | None = "exit 0\n",
) -> Path:
    d = root / "t1"
    (d / "workspace").mkdir(parents=True)
    if toml is not None:
        (d / "task.toml").write_text(toml)
    if verify is not None:
        (d / "verify.sh").write_text(verify)
    return d


def test_minimal_task_loads(tmp_path):
    """A task.toml with id and instruction plus a verifier is a valid task with defaults."""
    t = load_task(_write_task(tmp_path))
    assert t.id == "t1" and t.timeout_s == 600.0 and t.verify.interpreter == "bash"
    assert t.verify_command().endswith("bash .claw_verify/verify.sh")


def test_missing_verifier_is_named(tmp_path):
    """A task without a verifier names the task directory and what was expected."""
    d = _write_task(tmp_path, verify=None)
    with pytest.raises(TaskError, match=r"t1.*missing verifier.*verify\.py"):
        load_task(d)


def test_invalid_toml_is_named(tmp_path):
    """Invalid TOML names the task.toml file."""
    d = _write_task(tmp_path, toml='id = "t1\ninstruction = ')
    with pytest.raises(TaskError, match=r"task\.toml: invalid TOML"):
        load_task(d)


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ('id = "bad id"\ninstruction = "x"\n', "'id'"),
        ('id = "t1"\n', "'instruction'"),
        ('id = "t1"\ninstruction = "x"\ntimeout_s = -1\n', "'timeout_s'"),
        ('id = "t1"\ninstruction = "x"\ndifficulty = "insane"\n', "'difficulty'"),
        ('id = "t1"\ninstruction = "x"\ntags = "a"\n', "'tags'"),
        ('id = "t1"\ninstruction = "x"\ncolour = "red"\n', "colour"),
        ('id = "t1"\ninstruction = "x"\n[verify]\npass_threshold = 2\n', "'pass_threshold'"),
    ],
)
def test_bad_fields_are_named(tmp_path, toml, field):
    """Each malformed field is named in the error together with the file."""
    with pytest.raises(TaskError, match="task.toml") as info:
        load_task(_write_task(tmp_path, toml=toml))
    assert field in str(info.value)


def test_binary_workspace_file_is_kept_byte_exact(tmp_path):
    """A non-UTF-8 workspace file loads as its exact bytes and plans as {"content_b64"}."""
    d = _write_task(tmp_path)
    data = b"\xff\xfe\x00" + bytes(range(256))
    (d / "workspace" / "blob.bin").write_bytes(data)
    task = load_task(d)
    assert task.workspace["blob.bin"] == data
    assert job_files(task.workspace)["blob.bin"] == {"content_b64": base64.b64encode(data).decode()}


def test_suite_directory_duplicate_ids_and_selection(tmp_path):
    """A directory of tasks loads as a suite; duplicate ids are an error; select filters by id and tag."""
    _write_task(tmp_path / "suite")
    s = load_suite(tmp_path / "suite")
    assert isinstance(s, Suite) and [t.id for t in s.tasks] == ["t1"]
    copy = tmp_path / "suite" / "t1-copy"
    copy.mkdir()
    for f in ("task.toml", "verify.sh"):
        (copy / f).write_text((tmp_path / "suite" / "t1" / f).read_text())
    with pytest.raises(TaskError, match="duplicate task id 't1'"):
        load_suite(tmp_path / "suite")
    assert [t.id for t in MINI.select(tags=["config", "ini"]).tasks] == ["ini-change-port"]
    with pytest.raises(TaskError, match="no task 'nope'"):
        MINI.select(["nope"])
    with pytest.raises(TaskError, match="unknown suite"):
        load_suite("no-such-suite")


def test_planted_files_cannot_fake_a_pass():
    """Reward hacks fail: a planted reward file, modules planted beside the verifier, a module exiting 0 on import."""
    plant = Script(
        name="solution.sh",
        interpreter="bash",
        text=(
            "mkdir -p .claw_verify\n"
            "echo '{\"all\": 1.0}' > .claw_verify/reward.json\n"
            "printf 'import sys\\nsys.exit(0)\\n' > .claw_verify/json.py\n"
            "printf 'import os\\nos._exit(0)\\n' > fizzbuzz.py\n"
        ),
    )
    base = MINI.get("fix-fizzbuzz")
    t = Task(
        id=base.id,
        instruction=base.instruction,
        workspace=base.workspace,
        verify=base.verify,
        hidden=base.hidden,
        solution=plant,
    )
    r = check_task(t, "solution")
    assert r["passed"] is False and r["reward"] == 0.0, r
    assert r["scores"] == {"hidden_tests": 0.0}
