"""The engine's kept-set sizes (`completion_kept` of a call) carried to samples (`kept`): each
token gets its generating call's size at its position, -1 on context and for calls without a
record, in every packing; samples of calls without the field have none."""

import json
from pathlib import Path

import numpy as np
import pytest
from claw_tree import BudgetError, RecordError, build_forest, build_samples, make_samples
from claw_tree.records import CALL_READS, Call, read_calls
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_testlib import call, corpora, outcome

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _tagged(row: dict) -> dict:
    """`row` with logprob -(1 + id) / 1e4 and kept id = 1000 * (hash of the call id) + position
    for each completion token: a token's logprob names the kept value it must carry."""
    base = 1000 * (sum(map(ord, row["call_id"])) % 997)
    ids = [base + j for j in range(len(row["completion_ids"]))]
    return {
        **row,
        "completion_logprobs": [-(1 + k) / 1e4 for k in ids],
        "completion_kept": ids,
    }


def test_kept_follows_the_call_that_generated_each_token():
    """kept[i] = the generating call's completion_kept at the token's position; -1 on prompt
    tokens, on tokens of a call without completion_kept and on an untrainable call's tokens."""
    calls = [
        {**call("a", 0, [1, 2], [3, 4]), "completion_kept": [5, 0]},
        call("a", 1, [1, 2, 3, 4, 5], [6]),  # no record: the learner decides
        {**call("a", 2, [1, 2, 3, 4, 5, 6, 7], [8, 9]), "completion_kept": [-1, 19]},
        {**call("a", 3, [1, 11], [10]), "completion_kept": [7], "trainable": False},
    ]
    (sample,) = make_samples(build_forest(calls), [outcome("a", 1.0)])
    by_token = dict(zip(sample["input_ids"], sample["kept"], strict=True))
    assert {t: by_token[t] for t in (3, 4, 6, 8, 9)} == {3: 5, 4: 0, 6: -1, 8: -1, 9: 19}
    assert all(by_token[t] == -1 for t in (1, 2, 5, 7, 11, 10))
    assert len(sample["kept"]) == len(sample["input_ids"])
    assert all(isinstance(k, int) for k in json.loads(json.dumps(_plain(sample)))["kept"])


def _plain(sample: dict) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in sample.items()}


def test_calls_without_the_field_add_no_kept():
    """No call with completion_kept: no `kept` key (the samples are what they were)."""
    calls = [call("a", 0, [1, 2], [3, 4]), call("a", 1, [1, 2, 3, 4, 5], [6])]
    (sample,) = make_samples(build_forest(calls), [outcome("a", 1.0)])
    assert "kept" not in sample


@settings(max_examples=60, deadline=None)
@given(
    corpora(),
    st.sampled_from(["session", "group", "batch"]),
    st.sampled_from([None, 6, 12, 40]),
    st.booleans(),
)
def test_every_packing_keeps_each_token_with_its_own_size(data, pack, budget, some):
    """In every packing and split, each trainable token's kept value is the one its call
    recorded at its position, checked through its logprob (which the same call supplies), and
    every other token has -1; with `some`, calls of session s0 have no record (-1 there)."""
    calls, outcomes = data
    calls = [c if some and c["session"] == "s0" else _tagged(c) for c in calls]
    try:
        batch = build_samples(build_forest(calls), outcomes, pack=pack, max_tokens=budget)
    except BudgetError:  # a path longer than the budget: nothing packed
        return
    for s in batch.samples:
        if "kept" not in s:
            assert all(c["session"] == "s0" for c in calls if c["session"] in s["sessions"])
            continue
        for lp, k, t in zip(s["logprobs"], s["kept"], s["trainable"], strict=True):
            if not t or k == -1:
                assert k == -1 or t
                continue
            assert k == round(-lp * 1e4) - 1


def test_reader_checks_completion_kept(tmp_path):
    """Call.from_dict reads completion_kept (in CALL_READS): one integer >= -1 per completion
    token; errors name file:line and the field."""
    assert "completion_kept" in CALL_READS
    ok = Call.from_dict({**call("a", 0, [1, 2], [3, 4]), "completion_kept": [3, -1]})
    assert ok.completion_kept is not None and ok.completion_kept.tolist() == [3, -1]
    assert ok.to_dict()["completion_kept"] == [3, -1]
    assert Call.from_dict(call("a", 0, [1, 2], [3, 4])).completion_kept is None
    for value, error in (
        ([3], "completion_kept: has 1 entries but completion_ids has 2"),
        ([3, -2], "completion_kept: values must be >= -1"),
        ([3, 1.5], "completion_kept: expected integers"),
        ([3, True], "completion_kept: expected integers"),
        ("3,1", "completion_kept: expected array"),
    ):
        path = tmp_path / "calls.jsonl"
        path.write_text(
            json.dumps({**call("a", 0, [1, 2], [3, 4]), "completion_kept": value}) + "\n"
        )
        with pytest.raises(RecordError) as err:
            list(read_calls(path))
        assert error in str(err.value) and "calls.jsonl:1" in str(err.value), str(err.value)


def test_samples_with_kept_validate_against_the_schema():
    """Samples carrying kept satisfy the claw.sample/v1 schema."""
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    calls = [
        {**call("a", 0, [1, 2], [3]), "completion_kept": [4]},
        call("b", 0, [1, 2], [6]),
    ]
    samples = make_samples(
        build_forest(calls), [outcome("a", 1.0), outcome("b", 0.0)], max_tokens=9
    )
    assert any("kept" in s for s in samples)
    for s in samples:
        assert list(validator.iter_errors(json.loads(json.dumps(_plain(s))))) == []
