"""Reading samples and policies: valid records round-trip, bad ones name file:line and field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from claw_rl import Policy, RecordError, Sample, read_samples
from claw_rl.records import append_routing
from rl_testlib import tree_sample


def _file(tmp_path, lines):
    p = tmp_path / "s.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_sample_round_trip():
    """from_dict(to_dict(s)) == s, and the documented example sample reads."""
    row = tree_sample([-1, 0, 1, 1, 3], [0, 1, 1, 1, 1], returns=True, versions=[-1, 2, 2, 2, 2])
    s = Sample.from_dict(row)
    assert Sample.from_dict(s.to_dict()) == s
    example = {
        "schema": "claw.sample/v1",
        "sample_id": "grpo-0",
        "algo": "grpo",
        "input_ids": [1, 17, 29, 5, 40],
        "position_ids": [0, 1, 2, 3, 4],
        "parent": [-1, 0, 1, 2, 3],
        "trainable": [0, 0, 0, 0, 1],
        "logprobs": [0, 0, 0, 0, -0.5],
        "advantages": [0, 0, 0, 0, 0.5],
        "loss_weights": [0, 0, 0, 0, 1],
        "sessions": ["s"],
        "groups": ["g"],
        "n_paths": 1,
        "tags": {},
    }
    assert len(Sample.from_dict(example)) == 5


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"schema": "claw.sample/v2"}, "unsupported version"),
        ({"schema": "claw.call/v1"}, "record type"),
        ({"parent": [-1, 0, 2]}, r"parent\[2\] = 2"),
        ({"position_ids": [0, 1, 1]}, r"position_ids\[2\] = 1, but its depth in the tree is 2"),
        ({"trainable": [1, 1, 1]}, "root"),
        ({"logprobs": [0.0, -1.0]}, "'logprobs' has 2 entries, input_ids has 3"),
        ({"advantages": [0, "x", 0]}, r"'advantages'\[1\] must be a finite number"),
        ({"loss_weights": [0, -1.0, 0]}, "negative"),
        ({"algo": "dpo"}, "algo"),
    ],
)
def test_bad_samples_name_file_line_and_field(tmp_path, patch, message):
    """Each defect is reported with the file, the line and the field."""
    good = tree_sample([-1, 0, 1], [0, 1, 1])
    p = _file(tmp_path, [json.dumps(good), json.dumps({**good, "sample_id": "b", **patch})])
    with pytest.raises(RecordError, match=message) as err:
        read_samples(p)
    assert "s.jsonl:2" in str(err.value)


def test_bad_lines_and_duplicates(tmp_path):
    """Not JSON, not an object, NaN, missing field, repeated sample_id (blank lines are skipped)."""
    good = json.dumps(tree_sample([-1, 0], [0, 1]))
    assert len(read_samples(_file(tmp_path, [good, "  "]))) == 1
    for lines, message in [
        ([good, "{nope"], "s.jsonl:2: not valid JSON"),
        ([good, "[1]"], "expected a JSON object"),
        ([good, "", "NaN"], "s.jsonl:3: .*NaN"),
        ([good, good], "repeats .*s.jsonl:1"),
        (['{"schema": "claw.sample/v1", "sample_id": "x"}'], "missing required field 'algo'"),
    ]:
        with pytest.raises(RecordError, match=message):
            read_samples(_file(tmp_path, lines))


def test_policy_record():
    """Policy records carry schema, name, version and path; unknown versions are rejected."""
    rec = Policy.now(name="tiny", version=2, path="/m", step=2, metrics={"loss": 0.1}).to_dict()
    assert rec["schema"] == "claw.policy/v1" and Policy.from_dict(rec).version == 2
    with pytest.raises(RecordError, match="unsupported version"):
        Policy.from_dict({**rec, "schema": "claw.policy/v9"})


# -- routing references (docs/formats.md, Routing store) ---------------------------------------


def _routed(tmp_path, rows=None, **patch):
    """A 3-token sample whose routing (3 tokens x 2 MoE layers x top 2 of 8) lies in
    s.routing next to s.jsonl; ``patch`` overrides fields of the reference."""
    rows = (
        np.array([[[0, 1], [2, 3]], [[-1, -1], [-1, -1]], [[7, 6], [5, 4]]])
        if rows is None
        else rows
    )
    ref = append_routing(tmp_path / "s.routing", rows, experts=8)
    return {**tree_sample([-1, 0, 1], [0, 1, 1]), "routing": {**ref, **patch}}


def test_routing_reference_round_trip(tmp_path, monkeypatch):
    """A sample's routing file resolves next to its JSONL file, loads lazily as (N, L, K), and
    to_dict writes it back (relative to a base directory, else absolute)."""
    row = _routed(tmp_path)
    (tmp_path / "s.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.chdir("/")
    (s,) = read_samples(tmp_path / "s.jsonl")
    assert s.routing is not None and s.routing.shape == (3, 2, 2)
    assert s.routing.load()[2].tolist() == [[7, 6], [5, 4]] and (s.routing.load()[1] == -1).all()
    assert s.to_dict(base=tmp_path)["routing"] == row["routing"]
    assert Sample.from_dict(s.to_dict()) == s  # absolute path, in memory
    assert "routing" not in Sample.from_dict(tree_sample([-1, 0], [0, 1])).to_dict()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"file": "../s.routing"}, r"routing.file.*'\.\.'"),
        ({"file": "nope.routing"}, r"routing.file.*cannot open"),
        ({"offset": 4}, r"routing.offset.*>= 8"),
        ({"offset": 20}, r"routing.offset.*run past the end"),
        ({"shape": [3, 2]}, r"routing.shape.*\[N, L, K\]"),
        ({"shape": [2, 2, 2]}, r"routing.shape.*2 rows for 3 tokens"),
        ({"dtype": "uint8"}, r"routing.dtype.*'int16'"),
        ({"experts": 0}, r"routing.experts.*>= 1"),
    ],
)
def test_bad_routing_names_file_line_and_field(tmp_path, patch, message):
    """Each defect of a routing reference is reported with file, line and field."""
    row = _routed(tmp_path, **patch)
    p = _file(tmp_path, [json.dumps(tree_sample([-1, 0], [0, 1])), json.dumps(row)])
    with pytest.raises(RecordError, match=message) as err:
        read_samples(p)
    assert "s.jsonl:2" in str(err.value)


def test_routing_values_checked_when_loaded(tmp_path):
    """A file that is not a routing file is refused on reading; out-of-range experts and
    half-recorded rows when the rows are loaded (a batch is made), naming token and layer."""
    (tmp_path / "bad.routing").write_bytes(b"NOTMAGIC" + bytes(24))
    with pytest.raises(RecordError, match="not a routing file"):
        Sample.from_dict(_routed(tmp_path, file="bad.routing"), "x.jsonl:1", tmp_path)
    for rows, where in [
        (np.array([[[0, 1], [2, 8]]] * 3), "token 0, MoE layer 1, slot 1 holds 8"),
        (np.array([[[0, 1], [2, 3]], [[-1, 2], [0, 1]], [[0, 1], [2, 3]]]), "token 1, MoE layer 0"),
    ]:
        (tmp_path / "s.routing").unlink()
        s = Sample.from_dict(_routed(tmp_path, rows), "x.jsonl:1", tmp_path)
        with pytest.raises(RecordError, match=where):
            s.routing.load()
