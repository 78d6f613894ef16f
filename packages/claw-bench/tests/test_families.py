"""Generated task families: claw-toy's toy-steps instances, their strict verifier and expert."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bench_testlib import check_task
from claw_bench import TaskError, load_suite
from claw_bench.cli import main
from claw_bench.families import PHRASINGS, expert_script, load_family
from claw_bench.tasks import Script, Task
from click.testing import CliRunner

TOY = load_suite("claw-toy")
STEPS = TOY.select(tags=["toy-steps"])
TRAIN = TOY.select(tags=["toy-steps", "train"]).tasks
HELDOUT = TOY.select(tags=["toy-steps", "heldout"]).tasks
FAMILY_DIR = Path(TRAIN[0].path or "")


def _with_solution(task: Task, script: str) -> Task:
    """The task with another 'reference solution' (what an agent might leave behind)."""
    data = {f: getattr(task, f) for f in ("id", "instruction", "workspace", "verify", "hidden")}
    return Task(
        **data,
        pass_threshold=task.pass_threshold,
        solution=Script(name="solution.sh", text=script, interpreter="bash"),
    )


def test_splits_ids_tags_and_determinism():
    """The family gives 128 train and 32 held-out instances, numbered ids, split tags; loading again gives the same."""
    assert [t.id for t in TRAIN] == [f"toy-steps-train-{i:04d}" for i in range(128)]
    assert [t.id for t in HELDOUT] == [f"toy-steps-heldout-{i:04d}" for i in range(32)]
    again = load_family(FAMILY_DIR)
    assert [(t.id, t.instruction, t.workspace, t.hidden) for t in again] == [
        (t.id, t.instruction, t.workspace, t.hidden) for t in STEPS.tasks
    ]
    assert all({"toy-steps", "multi-step"} <= set(t.tags) for t in STEPS.tasks)


def _template(t: Task) -> str:
    """The instruction with its source and target names replaced: its phrasing."""
    expected = json.loads(t.hidden["expected.json"])
    src = t.meta["expert"][0]["arguments"]["path"]
    return t.instruction.replace(src, "{src}").replace(expected["path"], "{dst}").strip()


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def _check_apart(train: list[Task], heldout: list[Task]) -> None:
    """Every training instance against every held-out one: no shared instance or phrasing, no
    held-out answer that is a training answer or occurs anywhere in a training instance (its
    workspace files, decoys included, its instruction, its hidden files), no held-out decoy either."""
    assert train and heldout
    seen = {(t.instruction, json.dumps(t.workspace, sort_keys=True)) for t in train}
    assert not any(
        (h.instruction, json.dumps(h.workspace, sort_keys=True)) in seen for h in heldout
    )
    assert not {_template(t) for t in train} & {_template(h) for h in heldout}
    train_text = [
        text for t in train for text in (t.instruction, *t.workspace.values(), *t.hidden.values())
    ]
    train_numbers = set().union(*(_numbers(text) for text in train_text))
    for h in heldout:
        answer = json.loads(h.hidden["expected.json"])["content"]
        assert not any(answer in text for text in train_text), (h.id, answer)
        assert not _numbers("".join(h.workspace.values())) & train_numbers, h.id


def test_heldout_instances_share_nothing_with_training():
    """The shipped split: no held-out instance, phrasing, answer or decoy number occurs in training;
    answers never repeat; each split varies its instructions."""
    _check_apart(TRAIN, HELDOUT)
    answers = [json.loads(t.hidden["expected.json"])["content"] for t in STEPS.tasks]
    assert len(set(answers)) == len(answers)
    assert len({_template(t) for t in TRAIN}) == len(PHRASINGS[0])
    assert len({_template(t) for t in HELDOUT}) == len(PHRASINGS[1])
    assert len({t.instruction for t in TRAIN}) > 10 and len({t.instruction for t in HELDOUT}) > 5


@pytest.mark.parametrize("seed", [1, 7])
def test_splits_stay_apart_for_other_seeds_sizes_and_three_splits(tmp_path, seed):
    """A copied family with another seed, larger splits and a third split: every pair of splits
    is kept apart as train and heldout are."""
    (tmp_path / "family.toml").write_text(
        f'family = "toy-steps"\nseed = {seed}\n[splits]\ntrain = 200\ndev = 40\ntest = 40\n'
    )
    (tmp_path / "verify.py").write_text((FAMILY_DIR / "verify.py").read_text())
    tasks = load_family(tmp_path)
    by = {s: [t for t in tasks if s in t.tags] for s in ("train", "dev", "test")}
    _check_apart(by["train"], by["dev"])
    _check_apart(by["train"], by["test"])
    _check_apart(by["dev"], by["test"])


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        ("train = 800\nheldout = 200\n", "heldout instance"),
        ("a = 1\nb = 1\nc = 1\nd = 1\n", "at most 3 splits"),
    ],
)
def test_splits_that_cannot_be_kept_apart_are_named(tmp_path, splits, message):
    """More instances than the 3-digit numbers allow, or more splits than phrasing groups, is a
    TaskError naming family.toml, not an endless draw or a shared phrasing."""
    (tmp_path / "family.toml").write_text(f'family = "toy-steps"\n[splits]\n{splits}')
    (tmp_path / "verify.py").write_text((FAMILY_DIR / "verify.py").read_text())
    with pytest.raises(TaskError, match="family.toml") as e:
        load_family(tmp_path)
    assert message in str(e.value)


def test_instance_needs_a_read_and_a_write():
    """The number is only in the named workspace file (never in the instruction), next to distractors."""
    for t in STEPS.tasks:
        expected = json.loads(t.hidden["expected.json"])
        src = t.meta["expert"][0]["arguments"]["path"]
        assert expected["content"] not in t.instruction
        assert t.workspace[src] == expected["content"] + "\n"
        assert len(t.workspace) == 3 and expected["path"] not in t.workspace
        assert [s.get("tool") for s in t.meta["expert"]] == ["read_file", "write_file", None]


@pytest.mark.parametrize("task", [TRAIN[3], HELDOUT[5]], ids=lambda t: t.id)
def test_verifier_is_strict(task):
    """Only the exact number in the target file passes; near misses, distractors and nothing get reward 0."""
    expected = json.loads(task.hidden["expected.json"])
    dst, value = expected["path"], expected["content"]
    other = next(v.strip() for k, v in task.workspace.items() if v.strip() != value)
    cases = {
        f"printf '{value}' > {dst}": 1.0,
        f"printf '{value}\\n' > {dst}": 1.0,
        f"printf ' {value}' > {dst}": 0.0,
        f"printf '{value}\\n\\n' > {dst}": 0.0,
        f"printf '{value}0' > {dst}": 0.0,
        f"printf '{other}' > {dst}": 0.0,
        f"printf '{value}' > answer.txt": 0.0,
        "true": 0.0,
    }
    for script, reward in cases.items():
        r = check_task(_with_solution(task, script), "solution")
        assert r["reward"] == reward and r["passed"] is (reward == 1.0), (script, r)
        assert r["scores"] == {"exact": reward}


def test_expert_script_plays_each_task_by_session_tag():
    """expert_script gives one scripted-engine line per expert step, keyed by the task tag."""
    t = HELDOUT[0]
    lines = expert_script([t])
    step = t.meta["expert"]
    assert lines == [
        {
            "tags": {"task": t.id},
            "tool_calls": [{"name": "read_file", "arguments": step[0]["arguments"]}],
        },
        {
            "tags": {"task": t.id},
            "tool_calls": [{"name": "write_file", "arguments": step[1]["arguments"]}],
        },
        {"tags": {"task": t.id}, "text": "done"},
    ]
    with pytest.raises(TaskError, match="toy-hello: no expert solution"):
        expert_script([TOY.get("toy-hello")])


def test_expert_slip_skips_the_last_tool_call_on_a_seeded_fraction():
    """slip drops the last tool call on exactly that fraction of tasks, the same ones for one seed."""
    full = expert_script(HELDOUT)
    assert expert_script(HELDOUT, slip=0.0) == full
    slipped = expert_script(HELDOUT, slip=0.5, seed=3)
    assert slipped == expert_script(HELDOUT, slip=0.5, seed=3)

    def short_tasks(lines):  # tasks whose expert stopped after the read
        n: dict[str, int] = {}
        for x in lines:
            n[x["tags"]["task"]] = n.get(x["tags"]["task"], 0) + 1
        assert set(n.values()) <= {2, 3}
        return {tid for tid, k in n.items() if k == 2}

    short = short_tasks(slipped)
    assert len(short) == round(0.5 * len(HELDOUT))
    for x in slipped:  # a slipped task: read, then straight to "done" with no write
        if x["tags"]["task"] in short and "tool_calls" in x:
            assert x["tool_calls"][0]["name"] == "read_file"
    assert short != short_tasks(expert_script(HELDOUT, slip=0.5, seed=4))
    assert len(expert_script(HELDOUT, slip=1.0)) == 2 * len(HELDOUT)
    with pytest.raises(TaskError, match="slip must be a fraction"):
        expert_script(HELDOUT, slip=1.5)


def test_expert_slips_spread_over_each_tasks_rollouts():
    """With samples S > 1 every line carries its rollout's `sample` tag, and each task's slips are
    spread over its rollouts: slip 0.5 x 2 abandons exactly one rollout of every task; 0.25 x 2
    one rollout of half the tasks; the rounded total over all rollouts is kept."""

    def slips(lines):  # (task, sample) -> lines played
        n: dict[tuple[str, str], int] = {}
        for x in lines:
            key = (x["tags"]["task"], x["tags"]["sample"])
            n[key] = n.get(key, 0) + 1
        assert set(n.values()) <= {2, 3}
        return {key for key, k in n.items() if k == 2}

    tasks = [t.id for t in HELDOUT]
    half = slips(expert_script(HELDOUT, slip=0.5, seed=1, samples=2))
    assert sorted(tid for tid, _ in half) == sorted(tasks)  # one slipped rollout per task
    assert {k for _, k in half} == {"0", "1"}  # not always the same rollout
    quarter = slips(expert_script(HELDOUT, slip=0.25, seed=1, samples=2))
    assert len(quarter) == round(0.25 * 2 * len(tasks)) == len({t for t, _ in quarter})
    three = slips(expert_script(HELDOUT, slip=0.5, seed=1, samples=3))
    per_task = [sum(t == tid for t, _ in three) for tid in tasks]
    assert len(three) == round(1.5 * len(tasks)) and set(per_task) == {1, 2}
    assert expert_script(HELDOUT, slip=0.5, seed=1, samples=2) != expert_script(
        HELDOUT, slip=0.5, seed=2, samples=2
    )
    with pytest.raises(TaskError, match="samples must be >= 1"):
        expert_script(HELDOUT, samples=0)


def test_expert_command(tmp_path):
    """`claw-bench expert` writes the script for the selected tasks; a task without one is a clear error."""
    out = tmp_path / "expert.jsonl"
    r = CliRunner().invoke(
        main, ["expert", "-s", "claw-toy", "--tag", "toy-steps", "--tag", "heldout", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 * len(HELDOUT) and rows[0]["tags"] == {"task": "toy-steps-heldout-0000"}
    two = tmp_path / "two.jsonl"
    argv = ["expert", "-s", "claw-toy", "--tag", "heldout", "--slip", "0.5", "-n", "2"]
    r = CliRunner().invoke(main, [*argv, "-o", str(two)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in two.read_text().splitlines()]
    assert len(rows) == 2 * 3 * len(HELDOUT) - len(HELDOUT)  # one write skipped per task
    assert rows[0]["tags"] == {"task": "toy-steps-heldout-0000", "sample": "0"}
    r = CliRunner().invoke(main, ["expert", "-s", "claw-toy", "--task", "toy-hello"])
    assert r.exit_code == 1 and "no expert solution" in r.output


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('family = "nope"\n[splits]\ntrain = 1\n', "field 'family' must be one of"),
        ('family = "toy-steps"\n', "table [splits]"),
        ('family = "toy-steps"\n[splits]\ntrain = -1\n', "train must be a count"),
        ('family = "toy-steps"\n[splits]\n"Bad Split" = 1\n', "split name 'Bad Split'"),
        ('family = "toy-steps"\nseed = "x"\n[splits]\ntrain = 1\n', "field 'seed'"),
        ('family = "toy-steps"\nsize = 3\n[splits]\ntrain = 1\n', "unknown field(s) ['size']"),
    ],
)
def test_bad_family_file_is_named(tmp_path, toml, message):
    """A malformed family.toml is a TaskError naming the file and the field."""
    (tmp_path / "family.toml").write_text(toml)
    (tmp_path / "verify.py").write_text((FAMILY_DIR / "verify.py").read_text())
    with pytest.raises(TaskError, match="family.toml") as e:
        load_family(tmp_path)
    assert message in str(e.value)


def test_custom_family_directory_as_a_suite(tmp_path):
    """A copied family directory with another seed and sizes loads as a suite of its own, with other instances."""
    (tmp_path / "family.toml").write_text(
        'family = "toy-steps"\nseed = 5\n[splits]\ntrain = 4\ntest = 2\n'
    )
    (tmp_path / "verify.py").write_text((FAMILY_DIR / "verify.py").read_text())
    s = load_suite(tmp_path)
    assert [t.id for t in s.tasks] == [f"toy-steps-train-{i:04d}" for i in range(4)] + [
        "toy-steps-test-0000",
        "toy-steps-test-0001",
    ]
    assert [t.workspace for t in s.tasks[:4]] != [t.workspace for t in TRAIN[:4]]


def test_expert_speaks_each_harness_tool_dialect():
    """Through Claude Code the expert calls Read / Write (file_path), through OpenClaw read /
    write (path), keyed to that harness's sessions; claw-agent keeps read_file / write_file."""
    task = TRAIN[0]
    src = task.meta["expert"][0]["arguments"]["path"]
    dst, value = (task.meta["expert"][1]["arguments"][k] for k in ("path", "content"))
    claude = expert_script([task], harness="claude-code")
    assert [line.get("tool_calls") for line in claude] == [
        [{"name": "Read", "arguments": {"file_path": src}}],
        [{"name": "Write", "arguments": {"file_path": dst, "content": value}}],
        None,
    ]
    assert all(line["tags"] == {"task": task.id, "harness": "claude-code"} for line in claude)
    claw = expert_script([task], harness="openclaw-chat")
    assert [c["name"] for line in claw for c in line.get("tool_calls", [])] == ["read", "write"]
    assert claw[1]["tool_calls"][0]["arguments"] == {"path": dst, "content": value}
    agent = expert_script([task], harness="claw-agent-steps")
    assert [c["name"] for line in agent for c in line.get("tool_calls", [])] == [
        "read_file",
        "write_file",
    ]
    assert expert_script([task]) == [line | {"tags": {"task": task.id}} for line in agent]


def test_expert_refuses_a_harness_without_a_dialect():
    """A harness whose tools the expert does not know is an error that names the known ones."""
    with pytest.raises(TaskError, match=r"harness 'codex'.*claude-code"):
        expert_script(TRAIN[:1], harness="codex")
