"""Public-suite loaders: what each layout becomes, layout detection, mixed suites, and bad input named by file and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from claw_bench import TaskError, load_suite
from claw_bench.loaders import LoadOptions, detect_layout, load_public, load_public_dir

PUBLIC = Path(__file__).parent / "fixtures" / "public"
CG = PUBLIC / "clawgym"
PB = PUBLIC / "pinchbench" / "tasks"
TB = PUBLIC / "harbor" / "tb-fix-config"


def test_clawgym_directory_loads_as_published():
    """data_entry.json, input_files/ and reward/: inputs in the workspace, reward/ hidden, mount dir remapped."""
    t = load_public(CG / "cg-csv-totals")[0]
    assert (t.id, t.source, t.pass_threshold) == ("cg-csv-totals", "clawgym", 1.0)
    assert t.workspace == {
        "input/sales.csv": (CG / "cg-csv-totals/input_files/input/sales.csv").read_text()
    }
    files = t.verify_files()
    assert {
        ".claw_verify/reward/reward.sh",
        ".claw_verify/reward/check.py",
        ".claw_verify/runner.json",
    } <= set(files)
    cfg = json.loads(files[".claw_verify/runner.json"])
    assert (
        cfg["command"] == "bash reward/reward.sh"
        and cfg["mount_dir"] == "/root/.openclaw/workspace"
    )
    assert cfg["timeout_s"] == 120 and t.verify_timeout_s > 120
    assert "/root/.openclaw" not in t.instruction and "data_processing" in t.tags
    assert ".claw_verify/details.json" in t.meta["collect"] and "judge" not in t.meta


def test_clawgym_hybrid_task_carries_the_judge_rubric():
    """A task with rules gets a judge spec: 0.7 checker + 0.3 rubric, the rubric listing each level."""
    t = load_public(CG / "cg-meeting-notes")[0]
    j = t.meta["judge"]
    assert j["weights"] == {"automated": 0.7, "llm_judge": 0.3} and j["grading"] == "hybrid"
    assert (
        "### clarity (file: output/actions.md)" in j["rubric"]
        and "- 0.5: items present but vague" in j["rubric"]
    )
    assert (
        json.loads(t.verify_files()[".claw_verify/runner.json"])["command"]
        == "python3 reward/check.py /root/.openclaw/workspace"
    )
    assert ".claw_verify/judge_files.json" in t.meta["collect"]


def test_clawgym_jsonl_form():
    """The JSONL form: prompt, hook_code, input_files with the checker under reward/; ids from task_id or file:line."""
    tasks = load_public(CG / "clawgym_tasks.jsonl")
    assert [t.id for t in tasks] == ["cg-jsonl-wordcount", "clawgym_tasks-0002"]
    a = tasks[0]
    assert set(a.workspace) == {"docs/a.txt"} and ".claw_verify/reward/test.py" in a.verify_files()
    assert a.instruction.startswith(
        "Count the words of docs/a.txt and write the number alone to output/count.txt"
    )
    assert a.meta["clawgym"]["origin_template"] == "count-words"


def test_pinchbench_markdown_loads_as_published():
    """Front matter, workspace_files from assets and inline, the prompt, grade() hidden, hybrid weights normalised."""
    t = load_public(PB / "task_01_word_stats.md")[0]
    assert (t.id, t.source, t.timeout_s) == ("task_01_word_stats", "pinchbench", 120.0)
    assert (
        set(t.workspace) == {"story.txt", "config/settings.json"}
        and "small robot" in t.workspace["story.txt"]
    )
    assert t.instruction.startswith("Read `story.txt`") and "def grade" not in t.instruction
    assert (
        "def grade(transcript: list, workspace_path: str)"
        in t.verify_files()[".claw_verify/grade.py"]
    )
    assert "expected_behavior" in t.meta and "judge" not in t.meta
    h = load_public(PB / "task_02_release_note.md")[0].meta["judge"]
    assert h["weights"] == {"automated": pytest.approx(0.6), "llm_judge": pytest.approx(0.4)}
    j = load_public(PB / "task_03_haiku.md")[0]
    assert j.meta["judge"]["weights"] == {"automated": 0.0, "llm_judge": 1.0}
    assert json.loads(j.verify_files()[".claw_verify/runner.json"])["kind"] == "none"


def test_harbor_tb2_gets_continuous_reward_runner_and_image():
    """Harbor / TB2: tests/ hidden and unchanged (run from /tests), verifier env exported, image tag from
    the Dockerfile's content."""
    t = load_public(TB)[0]
    assert {"tests/test.sh", "tests/explain.sh"} <= set(t.hidden)
    assert (
        t.hidden["tests/test.sh"] == (TB / "tests" / "test.sh").read_text()
    )  # no text is rewritten
    assert t.verify.name == "harbor_verify.sh" and "bash /tests/test.sh" in t.verify.text
    assert "export EXPECTED_PORT=8080" in t.verify.text and "timeout -s KILL 30 " in t.verify.text
    assert t.reward_file == "/logs/claw/reward.json"
    assert t.image.startswith("claw-harbor/tb-fix-config:") and t.meta["docker_context"] == str(
        TB / "environment"
    )
    assert (t.timeout_s, t.difficulty, t.pass_threshold) == (120.0, "easy", 1.0)
    assert t.meta["limits"] == {"cpus": 1.0, "memory_mb": 512}


def test_layout_detection_and_mixed_suite(tmp_path):
    """One directory mixing ClawGym dirs, a ClawGym JSONL, PinchBench .md, Harbor and claw tasks loads as one suite."""
    assert [
        detect_layout(p)
        for p in (CG / "cg-csv-totals", CG / "clawgym_tasks.jsonl", PB / "task_03_haiku.md", TB)
    ] == ["clawgym", "clawgym-jsonl", "pinchbench", "harbor"]
    assert detect_layout(PUBLIC / "README.md") is None and detect_layout(PUBLIC) is None
    (tmp_path / "outcomes.jsonl").write_text('{"schema": "claw.outcome/v1", "session": "s"}\n')
    assert detect_layout(tmp_path / "outcomes.jsonl") is None
    shutil.copytree(CG, tmp_path / "suite")
    shutil.copytree(TB, tmp_path / "suite" / "tb-fix-config")
    shutil.copy(PB / "task_02_release_note.md", tmp_path / "suite")
    shutil.copytree(load_suite("claw-toy").get("toy-yes").path, tmp_path / "suite" / "toy-yes")
    (tmp_path / "suite" / "NOTES.md").write_text("# not a task\n")
    s = load_suite(tmp_path / "suite", LoadOptions(pass_threshold=0.5))
    assert sorted((t.id, t.source) for t in s.tasks) == [
        ("cg-csv-totals", "clawgym"),
        ("cg-jsonl-wordcount", "clawgym"),
        ("cg-meeting-notes", "clawgym"),
        ("clawgym_tasks-0002", "clawgym"),
        ("task_02_release_note", "pinchbench"),
        ("tb-fix-config", "harbor"),
        ("toy-yes", "claw"),
    ]
    assert {t.pass_threshold for t in s.tasks if t.source != "claw"} == {0.5}
    assert [t.id for t in load_suite(CG / "clawgym_tasks.jsonl").tasks] == [
        "cg-jsonl-wordcount",
        "clawgym_tasks-0002",
    ]
    assert len(load_public_dir(PUBLIC / "pinchbench")) == 3
    assert [t.id for t in load_suite(PUBLIC / "pinchbench").tasks] == [
        t.id for t in load_suite(PB).tasks
    ]


def _copy(tmp_path: Path, src: Path) -> Path:
    d = tmp_path / src.name
    (shutil.copytree if src.is_dir() else shutil.copy)(src, d)
    return d


def test_task_missing_its_checker_is_refused(tmp_path):
    """A task without its checker is a TaskError naming the task and what is missing, in every layout."""
    d = _copy(tmp_path, CG / "cg-csv-totals")
    shutil.rmtree(d / "reward")
    with pytest.raises(
        TaskError,
        match=r"task cg-csv-totals .*missing checker: expected reward/reward\.sh or reward/check\.py",
    ):
        load_public(d)
    p = _copy(tmp_path, PB / "task_01_word_stats.md")
    p.write_text(p.read_text().split("## Automated Checks")[0])
    with pytest.raises(
        TaskError, match=r"task_01_word_stats\.md: missing checker: grading_type automated needs"
    ):
        load_public(p, LoadOptions(assets_dir=str(PUBLIC / "pinchbench" / "assets")))
    h = _copy(tmp_path, TB)
    (h / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"missing verifier: expected tests/test\.sh"):
        load_public(h)
    j = tmp_path / "x.jsonl"
    j.write_text(
        '{"prompt": "p", "hook_code": "python3 reward/t.py /w", "input_files": []}\n'
        '{"prompt": "p", "input_files": []}\n'
    )
    with pytest.raises(TaskError, match=r"x\.jsonl:1: missing checker: no reward/ files"):
        load_public(j)
    j.write_text('{"prompt": "p", "input_files": []}\n')
    with pytest.raises(TaskError, match=r"x\.jsonl:1: missing checker: field 'hook_code'"):
        load_public(j)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda t: t.replace("grading_type: automated", "grading_type: vibes"),
            r"field 'grading_type' must be one of",
        ),
        (
            lambda t: t.replace("timeout_seconds: 120", "timeout_seconds: soon"),
            r"field 'timeout_seconds' must be a positive number",
        ),
        (
            lambda t: t.replace("    dest: story.txt", "    dest: ../escape.txt"),
            r"workspace_files\[0\]: destination '../escape.txt'",
        ),
        (
            lambda t: t.replace("source: texts/story.txt", "source: texts/nope.txt"),
            r"workspace_files\[0\]: source 'texts/nope.txt' not found",
        ),
        (lambda t: t.replace("## Prompt", "## Task"), r"missing section '## Prompt'"),
        (lambda t: t.replace("id: task_01", "id: [task_01"), r"invalid YAML front matter"),
        (lambda t: t[4:], r"not a public task \(.*a PinchBench .md with front matter"),
    ],
)
def test_pinchbench_bad_input_names_file_and_field(tmp_path, edit, match):
    """Malformed PinchBench files are refused with the file and the field."""
    d = tmp_path / "tasks"
    d.mkdir()
    shutil.copytree(PUBLIC / "pinchbench" / "assets", tmp_path / "assets")
    p = d / "task_01_word_stats.md"
    p.write_text(edit((PB / "task_01_word_stats.md").read_text()))
    with pytest.raises(TaskError, match=match):
        load_public(p)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("{", r"data_entry\.json: invalid JSON"),
        (
            '{"task_id": "t", "user_query": ""}',
            r"field 'user_query'/'prompt' must be a non-empty string",
        ),
        (
            '{"task_id": "t", "user_query": "q", "input_mount_dir": "relative"}',
            r"field 'input_mount_dir' must be an absolute path",
        ),
        (
            '{"task_id": "t", "user_query": "q", "metadata": {"rules": [{"name": "x"}]}}',
            r"field 'rules\[0\]' needs a 'name' and a non-empty 'scores'",
        ),
    ],
)
def test_clawgym_bad_input_names_file_and_field(tmp_path, entry, match):
    """Malformed data_entry.json is refused with the file and the field."""
    d = _copy(tmp_path, CG / "cg-csv-totals")
    (d / "data_entry.json").write_text(entry)
    with pytest.raises(TaskError, match=match):
        load_public(d)


def test_clawgym_jsonl_bad_lines(tmp_path):
    """Bad JSONL lines name file:line; paths outside the workspace are refused."""
    j = tmp_path / "t.jsonl"
    for text, match in (
        ("{nope\n", r"t\.jsonl:1: not JSON"),
        (
            '\n{"prompt": "p", "hook_code": "h", "input_files": [{"file_path": "/etc/passwd", "content": ""}]}\n',
            r"t\.jsonl:2: input_files\[0\]: 'file_path' '/etc/passwd' is outside the workspace",
        ),
        (
            '{"prompt": "p", "hook_code": "h", "input_files": [{"file_path": "a"}]}\n',
            r"t\.jsonl:1: input_files\[0\]: needs 'file_path' and a string 'content'",
        ),
        ("\n", r"t\.jsonl: holds no tasks"),
    ):
        j.write_text(text)
        with pytest.raises(TaskError, match=match):
            load_public(j)
    with pytest.raises(TaskError, match=r"not a public task"):
        load_public(tmp_path)


def test_load_options_are_validated():
    """Out-of-range thresholds, relative workspace dirs and non-positive timeouts are refused."""
    for bad in (
        {"pass_threshold": 1.5},
        {"workspace_dir": "relative/ws"},
        {"checker_timeout_s": 0},
    ):
        with pytest.raises(ValueError):
            LoadOptions(**bad)
