"""OfficeQA as published: the loader, the scorer's parity with OfficeQA's reward.py, and a
plan -> run -> score -> report pipeline that gives Pass@1.

Parity fixtures (tests/data/officeqa/): ``officeqa_fixture.csv`` holds 30 invented questions in
OfficeQA's columns, with answers shaped like the published ones (thousands commas, percents,
negatives with a Unicode minus, accounting parentheses, bracketed lists mixing numbers and words,
dates, text, unit words, years, zero); ``corpus/`` holds invented stand-ins for their bulletins.
``expected_scores.jsonl`` is reward.py's ``score_answer`` on every question x every perturbation
of _officeqa_cases.py x every tolerance, made by

    python bench/officeqa_parity.py --reward reward.py --csv tests/data/officeqa/officeqa_fixture.csv \
        --write-expected tests/data/officeqa/expected_scores.jsonl

with reward.py from github.com/databricks/officeqa at commit
7b9a3c154ef9fb40215bb67934afc43e6799de16 (not committed here). The same script on the published
officeqa.csv (commit 28b583a5c033859fdc7bbac05124240549cc418d, 246 questions) agreed on all
29766 cases.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _officeqa_cases import PERTURBATIONS, TOLERANCES, cases
from bench_testlib import ModelServer, proxy_serve, run_job
from claw_bench import load_suite, read_records, write_records
from claw_bench.cli import main
from claw_bench.errors import TaskError
from claw_bench.loaders import detect_layout, load_officeqa_csv
from claw_bench.loaders._officeqa_score import final_answer, score_answer
from claw_bench.score import score_run
from click.testing import CliRunner

DATA = Path(__file__).parent / "data" / "officeqa"
CSV = DATA / "officeqa_fixture.csv"
CORPUS = DATA / "corpus"


def _rows() -> list[dict[str, str]]:
    with CSV.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _expected() -> dict[tuple[str, str, float], dict]:
    lines = (json.loads(x) for x in (DATA / "expected_scores.jsonl").read_text().splitlines())
    return {(x["uid"], x["case"], x["tolerance"]): x for x in lines}


def test_parity_with_reward_py_on_every_fixture_question_and_perturbation():
    """score_answer equals reward.py's on all 30 questions x 40 perturbations x 3 tolerances (+1)."""
    expected = _expected()
    seen, wrong = set(), []
    for row in _rows():
        for name, predicted, tol in cases(row["answer"]):
            want = expected[(row["uid"], name, tol)]
            assert want["predicted"] == predicted, (row["uid"], name)
            seen.add((row["uid"], name, tol))
            if score_answer(row["answer"], predicted, tol) != want["score"]:
                wrong.append((row["uid"], row["answer"], name, predicted, tol, want["score"]))
    assert seen == set(expected)
    assert len(seen) == 30 * (len(PERTURBATIONS) * len(TOLERANCES) + 1)
    assert wrong == []


def test_frozen_table_discriminates():
    """The table holds both outcomes for most perturbation kinds (it would catch a lenient scorer)."""
    scores = [x["score"] for x in _expected().values()]
    assert 0.5 < sum(scores) / len(scores) < 0.8
    by_case: dict[str, set[float]] = {}
    for (_, name, _), x in _expected().items():
        by_case.setdefault(name, set()).add(x["score"])
    assert by_case["exact"] == {0.0, 1.0}  # tolerance 1.5 is out of range: 0
    assert by_case["unable"] == by_case["empty"] == by_case["two_lines"] == {0.0}


@pytest.mark.parametrize(
    ("truth", "response", "tol", "want"),
    [
        ("3,417", "Looking...\n<FINAL_ANSWER>3417</FINAL_ANSWER>", 0.0, 1.0),
        (
            "3,417",
            "<FINAL_ANSWER>1</FINAL_ANSWER> no: <final_answer>3,417</final_answer>",
            0.0,
            1.0,
        ),
        ("3,417", "The total was 3,417 and 7.", 0.0, 0.0),  # two numbers for one
        ("3,417", "The total was 3,417 in 1940.", 0.0, 1.0),  # the year is not counted
        ("5.3 billion", "5.3 million", 0.0, 0.0),  # units disagree
        ("-1299", "(1,299)", 0.0, 1.0),  # accounting negative
        ("100", "101", 0.01, 1.0),
        ("100", "101", 0.0, 0.0),
        ("[8, 152260]", "[8,152,260]", 0.0, 1.0),  # list read with a thousands comma
        ("March 1977", "April 1977", 0.0, 0.0),
    ],
)
def test_score_answer_examples(truth, response, tol, want):
    """A few of reward.py's rules spelled out (the table above is the real check)."""
    assert score_answer(truth, response, tol) == want


def test_final_answer_is_the_last_tag_else_the_message():
    """OfficeQA's extraction: the last <FINAL_ANSWER> pair, any case, else the whole text."""
    assert final_answer("a <FINAL_ANSWER> 1 </FINAL_ANSWER> <Final_Answer>2</Final_Answer>") == "2"
    assert final_answer("just 3") == "just 3"


def test_loader_source_files_scope():
    """One task per row; the question's own bulletins are copied under corpus/ in the workspace."""
    tasks = load_officeqa_csv(CSV, corpus=CORPUS, scope="source_files")
    assert [t.id for t in tasks] == [r["uid"] for r in _rows()]
    t = {t.id: t for t in tasks}["Q003"]
    assert sorted(t.workspace) == ["corpus/bulletin_1971_07.txt", "corpus/bulletin_1971_08.txt"]
    assert (
        t.workspace["corpus/bulletin_1971_07.txt"] == (CORPUS / "bulletin_1971_07.txt").read_bytes()
    )
    assert "<FINAL_ANSWER>" in t.instruction and t.instruction.startswith("What was the change")
    assert t.meta["officeqa"] == {
        "answer": "-243.07",
        "tolerance": 0.0,
        "source_files": ["bulletin_1971_07.txt", "bulletin_1971_08.txt"],
    }
    assert t.difficulty == "hard" and t.source == "officeqa"


def test_loader_corpus_scope_names_the_read_only_folder(monkeypatch):
    """Whole-corpus tasks carry no files; the instruction names the corpus's absolute path."""
    monkeypatch.setenv("CLAW_BENCH_OFFICEQA_SCOPE", "corpus")
    monkeypatch.setenv("CLAW_BENCH_OFFICEQA_TOLERANCE", "0.01")
    tasks = load_suite(str(CSV)).tasks
    assert len(tasks) == 30 and all(not t.workspace for t in tasks)
    assert str(CORPUS.resolve()) in tasks[0].instruction
    assert tasks[0].meta["officeqa"]["tolerance"] == 0.01
    assert detect_layout(CSV) == "officeqa"


def test_loader_errors_name_the_row_and_field(tmp_path, monkeypatch):
    """A missing bulletin, an empty answer, a missing corpus or a bad setting is a clear TaskError."""
    bad = tmp_path / "q.csv"
    (tmp_path / "corpus").mkdir()
    bad.write_text("uid,question,answer,source_files\nA1,What?,1,nope.txt\n")
    with pytest.raises(TaskError, match=r"q.csv:2: source file 'nope.txt' is not in the corpus"):
        load_officeqa_csv(bad)
    bad.write_text("uid,question,answer,source_files\nA1,What?,,x.txt\n")
    with pytest.raises(TaskError, match=r"q.csv:2: field 'answer' is missing or empty"):
        load_officeqa_csv(bad)
    with pytest.raises(TaskError, match="corpus folder .* does not exist"):
        load_officeqa_csv(bad, corpus=tmp_path / "none")
    monkeypatch.setenv("CLAW_BENCH_OFFICEQA_TOLERANCE", "5")
    with pytest.raises(TaskError, match="CLAW_BENCH_OFFICEQA_TOLERANCE='5'"):
        load_officeqa_csv(CSV)


def _run(meta: dict, stdout: str = "", answer_file: str | None = None) -> dict:
    collected = {} if answer_file is None else {"answer.txt": answer_file}
    return {
        "schema": "claw.run/v1",
        "job_id": "j",
        "status": "ok",
        "exit_code": 0,
        "stdout_tail": stdout,
        "collected": collected,
        "verify": {"passed": True, "exit_code": 0, "reward": None},
        "meta": meta,
    }


def test_score_run_takes_the_answer_file_else_stdout():
    """claw-bench score grades the final message: answer.txt when collected, else stdout."""
    meta = {"session": "s", "task": "Q001", "harness": "h", "officeqa": {"answer": "1,234"}}
    hit = score_run(_run(meta, stdout="log\n<FINAL_ANSWER>1234</FINAL_ANSWER>"))
    assert (hit["reward"], hit["passed"]) == (1.0, True)
    assert hit["details"]["officeqa_answer"] == "1234"
    miss = score_run(_run(meta, stdout="<FINAL_ANSWER>1234</FINAL_ANSWER>", answer_file="1,235"))
    assert (miss["reward"], miss["passed"]) == (0.0, False)


def _cli(args):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_plan_run_score_report_pass_at_1(tmp_path, secret_file):
    """The README's command: claw-agent on the fixture CSV with a scripted model that reads the
    bulletin and answers right on odd-numbered questions (wrong on the rest): Pass@1 = 15/30."""
    truth = {r["uid"]: r for r in _rows()}

    def policy(tags, turn, body):
        row = truth[tags["task"]]
        if turn == 0:
            first = row["source_files"].splitlines()[0]
            return {"text": "reading", "tool_calls": [("bash", {"command": f"cat corpus/{first}"})]}
        right = int(row["uid"][1:]) % 2 == 1
        said = row["answer"] if right else "Unable to determine"
        return {"text": f"From the table.\n<FINAL_ANSWER>{said}</FINAL_ANSWER>"}

    jobs_path, runs_path, outs_path = (tmp_path / f for f in ("j.jsonl", "r.jsonl", "o.jsonl"))
    with ModelServer(policy) as srv:
        _cli(
            ["plan", "--suite", str(CSV), "--harness", "claw-agent-chat", "--proxy", srv.url]
            + ["--proxy-secret-file", str(secret_file), "-o", str(jobs_path)]
        )
        jobs = read_records(jobs_path, "claw.job/v1")
        write_records(runs_path, [run_job(j, tmp_path / "sandbox", collect=True) for j in jobs])
    assert len(srv.requests) == 60  # a bash call and an answer per question
    _cli(["score", str(runs_path), "-o", str(outs_path)])
    outcomes = read_records(outs_path, "claw.outcome/v1")
    assert {o["task"]: o["passed"] for o in outcomes} == {
        uid: int(uid[1:]) % 2 == 1 for uid in truth
    }
    rep = json.loads(_cli(["report", str(outs_path), "--json"]).output)
    assert rep["harnesses"][0]["pass@1"]["value"] == 0.5


@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
def test_whole_corpus_read_only_through_claw_sandbox(tmp_path, secret_file, monkeypatch):
    """Whole-corpus tasks through claw-sandbox's bwrap backend with --ro-path: the agent reads a
    bulletin at the corpus's own path but cannot write there, and every right answer passes."""
    monkeypatch.setenv("CLAW_BENCH_OFFICEQA_SCOPE", "corpus")
    corpus = str(CORPUS.resolve())
    truth = {r["uid"]: r for r in _rows()}
    denied: list[bool] = []

    def policy(tags, turn, body):
        row = truth[tags["task"]]
        if turn == 0:
            first = row["source_files"].splitlines()[0]
            cmd = f"head -1 {corpus}/{first} && touch {corpus}/planted"
            return {"text": "reading", "tool_calls": [("bash", {"command": cmd})]}
        denied.append("Read-only file system" in json.dumps(body))
        return {"text": f"<FINAL_ANSWER>{row['answer']}</FINAL_ANSWER>"}

    jobs_path, runs_path, outs_path = (tmp_path / f for f in ("j.jsonl", "r.jsonl", "o.jsonl"))
    with ModelServer(policy) as srv:
        _cli(
            ["plan", "--suite", str(CSV), "--harness", "claw-agent-chat", "--proxy", srv.url]
            + ["--proxy-secret-file", str(secret_file), "-o", str(jobs_path)]
            + ["--task", "Q001", "--task", "Q009", "--network", "proxy"]
        )
        subprocess.run(
            ["claw-sandbox", "run", str(jobs_path), "-o", str(runs_path), "--backend", "bwrap"]
            + ["--ro-path", corpus],
            check=True,
            timeout=600,
        )
    assert denied == [True, True] and not (CORPUS / "planted").exists()
    _cli(["score", str(runs_path), "-o", str(outs_path)])
    rep = json.loads(_cli(["report", str(outs_path), "--json"]).output)
    assert rep["harnesses"][0]["pass@1"]["value"] == 1.0


RUN_DATA = Path(__file__).parent / "data" / "officeqa-run"
TINY = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3"


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-proxy") is None, reason="claw-proxy CLI not on PATH")
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
@pytest.mark.skipif(not TINY.is_dir(), reason="tiny model fixture not in this checkout")
def test_readme_command_through_claw_proxy_and_claw_sandbox(tmp_path, secret_file):
    """The README's OfficeQA command with every piece real: `claw-bench rollouts` plans the two
    questions of data/officeqa-run for claw-agent-chat, runs them with `claw-sandbox run` on
    bwrap against `claw-proxy serve --engine scripted:answers.jsonl` (the model reads the
    bulletin from the workspace's corpus/, then answers one question right and one wrong), scores
    the final messages and `claw-bench report` says Pass@1 0.5."""
    outs = tmp_path / "officeqa-outcomes.jsonl"
    script = RUN_DATA / "answers.jsonl"
    with proxy_serve(tmp_path, script, secret_file, TINY, "--record-bodies") as (url, calls):
        subprocess.run(
            ["claw-bench", "rollouts", "--suite", str(RUN_DATA / "officeqa.csv")]
            + ["--harness", "claw-agent-chat", "--backend", "bwrap", "--proxy", url]
            + ["--proxy-secret-file", str(secret_file), "-o", str(outs)],
            check=True,
            timeout=600,
        )
    outcomes = {o["task"]: o for o in read_records(outs, "claw.outcome/v1")}
    assert {t: (o["status"], o["reward"]) for t, o in outcomes.items()} == {
        "OQ-RECEIPTS": ("ok", 1.0),
        "OQ-DEBT": ("ok", 0.0),
    }
    assert outcomes["OQ-DEBT"]["details"]["officeqa_answer"] == "49.0"
    recorded = [json.loads(x) for x in calls.read_text().splitlines()]
    assert len(recorded) == 4  # a read_file call and an answer per question
    assert sum("Interest-bearing debt | 48.4" in json.dumps(c) for c in recorded) == 2
    report = subprocess.run(
        ["claw-bench", "report", str(outs), "-k", "1", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert json.loads(report.stdout)["harnesses"][0]["pass@1"]["value"] == 0.5
