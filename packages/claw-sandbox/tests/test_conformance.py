"""Every shared conformance case (formats/conformance) through claw-sandbox's readers.

The job reader (`read_jobs` / `Job.from_dict`) and the reward-file parser are strict: each case
gets exactly its verdict. The runs-file reader used to resume (`read_runs`) is a projection of
``RUN_READS``: it judges those fields and accepts flaws anywhere else.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from claw_sandbox.errors import JobsFileError
from claw_sandbox.records import RUN_READS, BadLine, Job, read_jobs, read_runs
from claw_sandbox.workspace import parse_reward

CONFORMANCE = Path(__file__).resolve().parents[3] / "formats" / "conformance"


def _cases(name: str) -> list[dict]:
    lines = (CONFORMANCE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _verdict(case: dict, reads: tuple[str, ...] | None) -> str:
    """The verdict a reader reading `reads` (None: strict) owes this case."""
    field = case["field"]
    if reads is None or field is None or case["verdict"] != "reject":
        return case["verdict"]
    touched = any(
        r == field or r.startswith(field + ".") or field.startswith(r + ".") for r in reads
    )
    return "reject" if touched else "accept"


@pytest.mark.parametrize("case", _cases("claw.job.v1.jsonl"), ids=lambda c: c["case"])
def test_job_cases(tmp_path, case):
    """read_jobs gives every job case its verdict; a rejected line becomes a BadLine naming
    file:line and the field (so it is recorded as an error run, never dropped)."""
    got = list(read_jobs(io.StringIO(case["line"] + "\n"), "jobs.jsonl", base_dir=tmp_path))
    if case["verdict"] == "skip":
        assert got == []
    elif case["verdict"] == "accept":
        assert len(got) == 1 and isinstance(got[0], Job), got
    else:
        assert len(got) == 1 and isinstance(got[0], BadLine), got
        assert case["error"] in got[0].error and "jobs.jsonl:1" in got[0].error, got[0].error


@pytest.mark.parametrize("case", _cases("claw.run.v1.jsonl"), ids=lambda c: c["case"])
def test_run_cases(tmp_path, case):
    """read_runs (resume; projection of RUN_READS) judges exactly the fields it reads."""
    path = tmp_path / "runs.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    verdict = _verdict(case, RUN_READS)
    if verdict == "reject":
        with pytest.raises(JobsFileError) as err:
            read_runs(path)
        assert case["error"] in str(err.value) and "runs.jsonl:1" in str(err.value), str(err.value)
    else:
        rows, good = read_runs(path)
        assert len(rows) == (1 if verdict == "accept" else 0)
        assert good == path.stat().st_size


@pytest.mark.parametrize("case", _cases("reward-file.jsonl"), ids=lambda c: c["case"])
def test_reward_file_cases(case):
    """parse_reward gives every reward-file case its verdict, reward and sub-scores."""
    if case["verdict"] == "accept":
        assert parse_reward(case["text"]) == (case["reward"], case["scores"])
    else:
        with pytest.raises(ValueError):
            parse_reward(case["text"])
