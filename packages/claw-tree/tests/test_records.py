"""Bad input is named by file, line and field; --skip-invalid style reading counts what it skips."""

import io
import json

import pytest
from claw_tree import Call, Outcome, RecordError, read_calls, read_outcomes
from claw_tree.records import read_values
from tree_testlib import call, outcome


def _write(tmp_path, rows, name="calls.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda r: r.pop("session"), "session: missing required field"),
        (lambda r: r.update(schema="claw.call/v2"), "schema: unsupported version 'claw.call/v2'"),
        (lambda r: r.update(schema="claw.outcome/v1"), "schema: expected 'claw.call/v1'"),
        (
            lambda r: r.update(completion_logprobs=[-0.1]),
            "completion_logprobs: has 1 entries but completion_ids has 2",
        ),
        (lambda r: r.update(prompt_ids=[1, "2"]), "prompt_ids: token ids must be integers"),
        (lambda r: r.update(prompt_ids=[1, 2.5]), "prompt_ids: token ids must be integers"),
        (lambda r: r.update(completion_ids=[-1, 3]), "completion_ids: token ids must lie in"),
        (lambda r: r.update(seq="0"), "seq: expected integer"),
        (lambda r: r.update(policy={"name": "x"}), "policy: version: missing required field"),
        (lambda r: r.update(trainable="yes"), "trainable: expected boolean"),
        (lambda r: r.update(sampling=[0.7]), "sampling: expected object"),
        (
            lambda r: r.update(sampling={"temperature": "0.7"}),
            "sampling.temperature: expected a finite number",
        ),
        (lambda r: r.update(sampling={"temperature": -0.5}), "sampling.temperature: must be >= 0"),
        (lambda r: r.update(sampling={"top_p": 0.0}), "sampling.top_p: must lie in (0, 1]"),
        (lambda r: r.update(sampling={"top_p": 1.5}), "sampling.top_p: must lie in (0, 1]"),
        (lambda r: r.update(sampling={"top_k": 2.0}), "sampling.top_k: expected an integer >= 0"),
        (lambda r: r.update(sampling={"top_k": -1}), "sampling.top_k: expected an integer >= 0"),
        (lambda r: r.update(sampling={"top_k": True}), "sampling.top_k: expected an integer >= 0"),
    ],
)
def test_bad_call_names_file_line_and_field(tmp_path, mutate, expected):
    """A malformed call on line 2 is rejected with `file:2: field: reason`."""
    bad = call("s", 1, [1, 2], [3, 4])
    mutate(bad)
    path = _write(tmp_path, [call("s", 0, [1], [2]), bad])
    with pytest.raises(RecordError) as info:
        read_calls(str(path))
    assert str(info.value).startswith(f"{path}:2: ")
    assert expected in str(info.value)


def test_not_json_is_named_and_skip_invalid_counts(tmp_path):
    """A non-JSON line fails by default; with skip_invalid it is skipped and reported with its reason."""
    path = _write(tmp_path, [call("s", 0, [1], [2]), "{oops", "", call("s", 1, [1, 2], [3])])
    with pytest.raises(RecordError, match=r"calls.jsonl:2: not JSON"):
        read_calls(path)
    result = read_calls(path, skip_invalid=True)
    assert len(result.records) == 2
    assert len(result.skipped) == 1 and ":2: not JSON" in result.skipped[0]


def test_reading_from_a_stream_and_from_dicts():
    """Streams and in-memory dicts read the same; in-memory errors name the record index."""
    text = json.dumps(call("s", 0, [1], [2])) + "\n"
    assert read_calls(io.StringIO(text)).records[0].call_id == "s-c0"
    with pytest.raises(RecordError, match=r"<record 1>: call_id: missing"):
        read_calls([call("s", 0, [1], [2]), {"schema": "claw.call/v1"}])


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda r: r.update(status="crashed"), "status: 'crashed' is not one of"),
        (lambda r: r.update(reward=None), "reward: null although status is 'ok'"),
        (lambda r: r.pop("group"), "group: missing required field"),
        (lambda r: r.update(reward="1"), "reward: expected number"),
    ],
)
def test_bad_outcome_is_named(tmp_path, mutate, expected):
    """Outcome errors name file, line and field."""
    bad = outcome("s", 1.0)
    mutate(bad)
    path = _write(tmp_path, [bad], "outcomes.jsonl")
    with pytest.raises(RecordError, match="outcomes.jsonl:1: ") as info:
        read_outcomes(path)
    assert expected in str(info.value)


def test_records_from_dict_keep_the_fields_the_tree_needs():
    """Call and Outcome parse the optional prefix and passthrough information."""
    c = Call.from_dict(
        call(
            "s",
            0,
            [1],
            [2],
            trainable=False,
            prefix={"reused_tokens": 3, "rendered_tokens": 1, "fresh_render_matches": False},
        )
    )
    assert (c.trainable, c.reused_tokens, c.fresh_render_matches) == (False, 3, False)
    row = c.to_dict()
    assert row["prompt_ids"] == [1] and row["prefix"] == {
        "reused_tokens": 3,
        "fresh_render_matches": False,
    }
    again = Call.from_dict({**row, "api": "openai.chat", "started_at": 0, "ended_at": 1})
    assert again.same_content(c) and again.to_dict() == row
    o = Outcome.from_dict(outcome("s", 0, status="infra_error"))
    assert o.reward is None and o.to_dict()["status"] == "infra_error"


def test_values_file_errors_are_named(tmp_path):
    """Critic values: non-numbers and repeated sample ids are named by line."""
    path = _write(
        tmp_path,
        [{"sample_id": "a", "values": [0.1, 2]}, {"sample_id": "a", "values": [1]}],
        "v.jsonl",
    )
    with pytest.raises(RecordError, match=r"v.jsonl:2: sample_id: 'a' appears twice"):
        read_values(path)
    path = _write(tmp_path, [{"sample_id": "a", "values": [0.1, "x"]}], "w.jsonl")
    with pytest.raises(RecordError, match=r"w.jsonl:1: values: expected numbers"):
        read_values(path)


def test_sampling_is_read_with_defaults_and_round_trips():
    """`sampling` gives temperature/top_p/top_k; absent or partial means 1 / 1 / 0; to_dict keeps it."""
    plain = Call.from_dict(call("s", 0, [1], [2]))
    assert (plain.temperature, plain.top_p, plain.top_k) == (1.0, 1.0, 0) and plain.default_sampling
    assert "sampling" not in plain.to_dict()
    row = call("s", 0, [1], [2])
    row["sampling"] = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "forced": False,
        "max_tokens": 8,
        "seed": None,
    }
    hot = Call.from_dict(row)
    assert (hot.temperature, hot.top_p, hot.top_k) == (0.7, 0.9, 20) and not hot.default_sampling
    assert hot.to_dict()["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
    greedy = Call.from_dict({**call("s", 0, [1], [2]), "sampling": {"temperature": 0}})
    assert (greedy.temperature, greedy.top_p, greedy.top_k) == (0.0, 1.0, 0)
    assert not hot.same_content(plain)


def test_a_sharded_record_series_is_read_whole_and_in_order(tmp_path):
    """read_calls on `calls.jsonl` reads its shards `calls.00001.jsonl`, ... in index order up to
    the first missing one (not the first file alone); a shard's own path reads that shard; an
    error in a later shard names that shard's file and line."""
    _write(tmp_path, [call("s", 0, [1], [2])])
    _write(tmp_path, [call("s", 1, [1, 2], [3]), call("t", 0, [5], [6])], "calls.00001.jsonl")
    _write(tmp_path, [call("s", 2, [1, 2, 3], [4])], "calls.00002.jsonl")
    _write(tmp_path, [call("u", 0, [7], [8])], "calls.00004.jsonl")  # after a gap: not in it
    got = read_calls(tmp_path / "calls.jsonl").records
    assert [(c.session, c.seq) for c in got] == [("s", 0), ("s", 1), ("t", 0), ("s", 2)]
    alone = read_calls(tmp_path / "calls.00001.jsonl").records
    assert [(c.session, c.seq) for c in alone] == [("s", 1), ("t", 0)]
    _write(tmp_path, [call("s", 2, [1, 2, 3], [4]), "{oops"], "calls.00002.jsonl")
    with pytest.raises(RecordError, match=r"calls\.00002\.jsonl:2: not JSON"):
        read_calls(tmp_path / "calls.jsonl")
    assert len(read_calls(tmp_path / "calls.jsonl", skip_invalid=True).records) == 4


def test_fork_fields_are_read_checked_and_written_back():
    """prefix.fork_reason / fork_of are read (non-empty strings or null) and written back."""
    row = call("s", 1, [1, 2], [3], prefix={"fork_reason": "record_unreadable", "fork_of": "c0"})
    c = Call.from_dict(row)
    assert (c.fork_reason, c.fork_of) == ("record_unreadable", "c0")
    assert c.to_dict()["prefix"] == {"fork_reason": "record_unreadable", "fork_of": "c0"}
    for bad in ({"fork_reason": 3}, {"fork_reason": ""}, {"fork_of": ["c0"]}):
        with pytest.raises(RecordError, match="prefix.fork_"):
            Call.from_dict(call("s", 1, [1, 2], [3], prefix=bad))
