"""Every shared conformance case (formats/conformance) through claw-rl's readers.

Sample and Policy are strict readers: each case gets exactly its verdict. The call reader of
``claw-rl logprobs`` is a projection: it judges only the fields in CALL_READS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_rl.errors import RecordError
from claw_rl.records import ROUTING_MAGIC, Policy, iter_jsonl, read_samples

CONFORMANCE = Path(__file__).resolve().parents[3] / "formats" / "conformance"
CALL_READS = {
    "schema",
    "call_id",
    "trainable",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "sampling.temperature",
    "sampling.top_p",
    "sampling.top_k",
    "completion_kept",
    "prefix.reused_tokens",
    "prefix.parent_call",
    "routing",
}


def _cases(name: str) -> list[dict]:
    lines = (CONFORMANCE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _verdict(case: dict, reads: set[str] | None) -> str:
    """The verdict a reader reading `reads` (None: strict) owes this case."""
    field = case["field"]
    if reads is None or field is None or case["verdict"] != "reject":
        return case["verdict"]
    touched = any(
        r == field or r.startswith(field + ".") or field.startswith(r + ".") for r in reads
    )
    return "reject" if touched else "accept"


def _check(tmp_path: Path, case: dict, read, reads: set[str] | None = None) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    verdict = _verdict(case, reads)
    if verdict == "reject":
        with pytest.raises(RecordError) as err:
            read(path)
        assert case["error"] in str(err.value) and "in.jsonl:1" in str(err.value), str(err.value)
    else:
        assert len(read(path)) == (1 if verdict == "accept" else 0)


def _read_policies(path: Path) -> list:
    return [Policy.from_dict(row, where) for where, row in iter_jsonl(path)]


def _read_calls(path: Path) -> list:
    from claw_rl.calls import call_to_sample  # torch: imported only by this test

    return [(call_to_sample(row, where),) for where, row in iter_jsonl(path)]


@pytest.mark.parametrize("case", _cases("claw.sample.v1.jsonl"), ids=lambda c: c["case"])
def test_sample_cases(tmp_path, case):
    """read_samples (strict) gives every sample case its verdict, naming file:line and field.
    The cases' routing references name ``samples.routing`` next to the samples file: a routing
    file (magic, then zeros: expert 0) large enough for every shape they accept stands there."""
    (tmp_path / "samples.routing").write_bytes(ROUTING_MAGIC + bytes(2 * 11 * 48 * 8))
    _check(tmp_path, case, read_samples)


@pytest.mark.parametrize("case", _cases("claw.policy.v1.jsonl"), ids=lambda c: c["case"])
def test_policy_cases(tmp_path, case):
    """Policy.from_dict (strict) gives every policy case its verdict."""
    _check(tmp_path, case, _read_policies)


@pytest.mark.parametrize("case", _cases("claw.call.v1.jsonl"), ids=lambda c: c["case"])
def test_call_cases(tmp_path, case):
    """The logprobs command's call reader (projection) judges exactly the fields it reads."""
    _check(tmp_path, case, _read_calls, CALL_READS)
