"""Every shared conformance case (formats/conformance) through claw-tree's readers.

Outcome is a strict reader: each case gets exactly its verdict. Call is a projection: it judges
the fields in ``CALL_READS`` and accepts flaws anywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_tree.errors import RecordError
from claw_tree.records import CALL_READS, read_calls, read_outcomes, read_values
from claw_tree.routing import read_sample_routing

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


def _check(tmp_path: Path, case: dict, read, reads: tuple[str, ...] | None = None) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    verdict = _verdict(case, reads)
    if verdict == "reject":
        with pytest.raises(RecordError) as err:
            read(path)
        assert case["error"] in str(err.value) and "in.jsonl:1" in str(err.value), str(err.value)
        assert len(read(path, skip_invalid=True).skipped) == 1
    else:
        assert len(read(path).records) == (1 if verdict == "accept" else 0)


@pytest.mark.parametrize("case", _cases("claw.call.v1.jsonl"), ids=lambda c: c["case"])
def test_call_cases(tmp_path, case):
    """read_calls (projection) judges exactly the fields it reads, naming file:line and field."""
    _check(tmp_path, case, read_calls, CALL_READS)


@pytest.mark.parametrize("case", _cases("claw.outcome.v1.jsonl"), ids=lambda c: c["case"])
def test_outcome_cases(tmp_path, case):
    """read_outcomes (strict) gives every outcome case its verdict."""
    _check(tmp_path, case, read_outcomes)


@pytest.mark.parametrize("case", _cases("values-file.jsonl"), ids=lambda c: c["case"])
def test_values_file_cases(tmp_path, case):
    """read_values (strict) gives every values-file case its verdict, naming file:line and field."""
    path = tmp_path / "in.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    if case["verdict"] == "reject":
        with pytest.raises(RecordError) as err:
            read_values(path)
        assert case["error"] in str(err.value) and "in.jsonl:1" in str(err.value), str(err.value)
    else:
        assert len(read_values(path)) == (1 if case["verdict"] == "accept" else 0)


def _routing_cases() -> list[dict]:
    """The sample cases about ``routing`` (the golden sample with a routing reference)."""
    cases = _cases("claw.sample.v1.jsonl")
    return [c for c in cases if (c["field"] or c["case"]).startswith("routing")]


@pytest.mark.parametrize("case", _routing_cases(), ids=lambda c: c["case"])
def test_sample_routing_cases(tmp_path, case):
    """read_sample_routing (what claw-tree writes, read back) gives every sample routing case
    its verdict; an accepted reference reads a store of -1 rows written next to the sample."""
    row = json.loads(case["line"])
    ref = row["routing"]
    if case["verdict"] == "reject":
        with pytest.raises(RecordError) as err:
            read_sample_routing(row, tmp_path, "in.jsonl:1")
        assert case["error"] in str(err.value) and "in.jsonl:1" in str(err.value), str(err.value)
        return
    n, n_layers, k = ref["shape"]
    (tmp_path / ref["file"]).write_bytes(b"CLAWRT1\n" + b"\xff\xff" * (n * n_layers * k))
    rows = read_sample_routing(row, tmp_path)
    assert rows is not None and rows.shape == (n, n_layers, k) and (rows == -1).all()
