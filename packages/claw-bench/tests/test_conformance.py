"""Shared conformance cases (formats/conformance) through claw-bench's readers.

`iter_records` is a projection of the line and its ``schema``; `score`'s run reader adds
`check_run` (a projection of RUN_READS) and `report`'s outcome reader `check_outcome` (of
OUTCOME_READS). `verify_token` and `parse_reward` are strict: each case gets its verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_bench.errors import RecordError
from claw_bench.records import OUTCOME, RUN, read_records
from claw_bench.report import OUTCOME_READS, check_outcome, report
from claw_bench.reward import parse_reward
from claw_bench.score import RUN_READS, check_run, score_run
from claw_bench.token import mint_token, verify_token

CONFORMANCE = Path(__file__).resolve().parents[3] / "formats" / "conformance"
RECORD_READS = ("schema",)


def _cases(name: str) -> list[dict]:
    lines = (CONFORMANCE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _verdict(case: dict, reads: tuple[str, ...]) -> str:
    """The verdict a projection reader reading `reads` owes this case."""
    field = case["field"]
    if field is None or case["verdict"] != "reject":
        return case["verdict"]
    touched = any(
        r == field or r.startswith(field + ".") or field.startswith(r + ".") for r in reads
    )
    return "reject" if touched else "accept"


RECORD_CASES = [
    (f"claw.{kind}/v1", c)
    for kind in ("run", "outcome", "call")
    for c in _cases(f"claw.{kind}.v1.jsonl")
]


@pytest.mark.parametrize(
    ("schema", "case"), RECORD_CASES, ids=lambda x: x if isinstance(x, str) else x["case"]
)
def test_record_cases(tmp_path, schema, case):
    """read_records judges every line and schema (NaN, versions, blank lines) as the contract says."""
    path = tmp_path / "in.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    verdict = _verdict(case, RECORD_READS)
    if verdict == "reject":
        with pytest.raises(RecordError) as err:
            read_records(path, schema)
        assert case["error"] in str(err.value) and "in.jsonl:1" in str(err.value), str(err.value)
    else:
        assert len(read_records(path, schema)) == (1 if verdict == "accept" else 0)


@pytest.mark.parametrize("case", _cases("session-token.jsonl"), ids=lambda c: c["case"])
def test_session_token_cases(case):
    """verify_token accepts exactly the genuine tokens, with their session and tags."""
    key = case["secret"].strip().encode("utf-8")
    got = verify_token(case["token"], key)
    if case["verdict"] == "accept":
        assert got == (case["session"], case["tags"])
        assert mint_token(case["session"], key, case["tags"]) == case["token"]
    else:
        assert got is None


@pytest.mark.parametrize("case", _cases("reward-file.jsonl"), ids=lambda c: c["case"])
def test_reward_file_cases(case):
    """parse_reward reads exactly the reward files the contract accepts; others give (None, {})."""
    want = (case["reward"], case["scores"]) if case["verdict"] == "accept" else (None, {})
    assert parse_reward(case["text"]) == want


def _projection_cases(kind: str, reads: tuple[str, ...]):
    for c in _cases(f"claw.{kind}.v1.jsonl"):
        yield c, _verdict(c, reads)


@pytest.mark.parametrize(
    ("case", "verdict"),
    list(_projection_cases("run", RUN_READS)),
    ids=lambda x: x if isinstance(x, str) else x["case"],
)
def test_run_cases_through_score(tmp_path, case, verdict):
    """`claw-bench score`'s reader (read_records + check_run, a projection of RUN_READS) judges
    exactly the fields it reads; every run it accepts scores to an outcome."""
    path = tmp_path / "runs.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    if case["case"] == "meta absent":  # a valid run, but not one claw-bench planned
        verdict, case = "reject", {**case, "error": "meta.session"}
    if verdict == "reject":
        with pytest.raises(RecordError) as err:
            for row in read_records(path, RUN, check_run):
                score_run(row, where="runs.jsonl:1")
        assert case["error"] in str(err.value) and "runs.jsonl:1" in str(err.value), str(err.value)
    else:
        rows = read_records(path, RUN, check_run)
        assert len(rows) == (1 if verdict == "accept" else 0)
        assert all(score_run(r)["schema"] == OUTCOME for r in rows)


@pytest.mark.parametrize(
    ("case", "verdict"),
    list(_projection_cases("outcome", OUTCOME_READS)),
    ids=lambda x: x if isinstance(x, str) else x["case"],
)
def test_outcome_cases_through_report(tmp_path, case, verdict):
    """`claw-bench report`'s reader (read_records + check_outcome, a projection of
    OUTCOME_READS) judges exactly the fields it reads."""
    path = tmp_path / "outcomes.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    if verdict == "reject":
        with pytest.raises(RecordError) as err:
            read_records(path, OUTCOME, check_outcome)
        assert case["error"] in str(err.value) and "outcomes.jsonl:1" in str(err.value), str(
            err.value
        )
    else:
        rows = read_records(path, OUTCOME, check_outcome)
        assert len(rows) == (1 if verdict == "accept" else 0)
        if rows:
            assert report(rows)["harnesses"][0]["harness"] == rows[0]["harness"]
