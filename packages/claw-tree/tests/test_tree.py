"""Forest building against a per-token dict trie; order and duplicate invariance; branching."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from claw_tree import ConflictError, build_forest, trajectory_record
from hypothesis import given, settings
from tree_testlib import call, corpora, naive_trie

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _forest_nodes(forest):
    """(session, prefix) -> [generated, logprob, version] read back from the forest arrays."""
    out = {}
    for t in forest.sessions:
        prefixes = {}
        for v in range(t.start, t.stop):
            p = forest.parent[v]
            prefixes[v] = (prefixes[p] if p >= 0 else ()) + (int(forest.tokens[v]),)
            out[(t.name, prefixes[v])] = [
                bool(forest.trainable[v]),
                float(forest.logprobs[v]),
                int(forest.policy_version[v]),
            ]
    return out


@settings(max_examples=150, deadline=None)
@given(corpora())
def test_forest_equals_naive_trie(data):
    """Every node is a unique (session, prefix) with the reference's flag, logprob and version."""
    calls, _ = data
    forest = build_forest(calls)
    assert forest.n_nodes == len(naive_trie(calls))
    assert _forest_nodes(forest) == naive_trie(calls)
    idx = np.arange(forest.n_nodes)
    assert (forest.parent < idx).all()
    has_parent = forest.parent >= 0
    assert (forest.depth[has_parent] == forest.depth[forest.parent[has_parent]] + 1).all()
    assert (forest.depth[~has_parent] == 0).all()


@settings(max_examples=100, deadline=None)
@given(corpora())
def test_order_and_duplicates_do_not_matter(data):
    """Shuffled and re-duplicated input gives identical arrays and trajectories."""
    calls, _ = data
    a = build_forest(calls)
    shuffled = list(reversed(calls)) + calls[:2]
    random.Random(0).shuffle(shuffled)
    b = build_forest(shuffled)
    for field in ("tokens", "parent", "depth", "trainable", "logprobs", "policy_version"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert [t.segments for t in a.trajectories] == [t.segments for t in b.trajectories]
    assert [t.call_ids for t in a.trajectories] == [t.call_ids for t in b.trajectories]
    assert b.duplicates == len(shuffled) - len({c["call_id"] for c in calls})


@settings(max_examples=100, deadline=None)
@given(corpora())
def test_trajectories_are_root_to_leaf_paths(data):
    """Trajectories are exactly the leaves; each lists the calls whose sequence lies on it."""
    calls, _ = data
    forest = build_forest(calls)
    has_child = np.zeros(forest.n_nodes, dtype=bool)
    has_child[forest.parent[forest.parent >= 0]] = True
    assert sorted(t.leaf for t in forest.trajectories) == sorted(
        np.flatnonzero(~has_child).tolist()
    )
    unique = {c["call_id"]: c for c in calls}
    for t in forest.trajectories:
        nodes = t.nodes()
        assert forest.parent[nodes[0]] == -1
        assert (forest.parent[nodes[1:]] == nodes[:-1]).all()
        path = forest.tokens[nodes].tolist()
        expected = sorted(
            cid
            for cid, c in unique.items()
            if c["session"] == t.session
            and (c["prompt_ids"] + c["completion_ids"])
            and path[: len(c["prompt_ids"] + c["completion_ids"])]
            == c["prompt_ids"] + c["completion_ids"]
        )
        assert sorted(t.call_ids) == expected


def test_golden_calls_make_one_chain():
    """The golden example: turn 2 extends turn 1, so one path with both calls' outputs trainable."""
    calls = [
        json.loads(x) for x in (FORMATS / "claw.call.v1.example.jsonl").read_text().splitlines()
    ]
    forest = build_forest(calls)
    assert forest.n_nodes == 11 and len(forest.trajectories) == 1
    row = trajectory_record(forest, forest.trajectories[0], with_ids=True)
    assert row["calls"] == ["c-0001", "c-0002"]
    assert [(s["kind"], s["call"]) for s in row["spans"]] == [
        ("context", None),
        ("output", "c-0001"),
        ("context", None),
        ("output", "c-0002"),
    ]
    assert row["trainable"] == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_divergence_starts_a_branch_at_the_longest_common_prefix():
    """A compacted history branches where it diverges; a side call with nothing shared is a new root."""
    calls = [
        call("s", 0, [1, 2, 3], [4, 5]),
        call("s", 1, [1, 2, 3, 4, 5, 6], [7]),
        call("s", 2, [1, 2, 9], [8]),  # compaction: diverges after [1, 2]
        call("s", 3, [50, 51], [52], model="small"),  # side call, new root
    ]
    forest = build_forest(calls)
    assert forest.n_nodes == 7 + 2 + 3
    assert len(forest.trajectories) == 3
    paths = {t.call_ids: forest.tokens[t.nodes()].tolist() for t in forest.trajectories}
    assert paths[("s-c0", "s-c1")] == [1, 2, 3, 4, 5, 6, 7]
    assert paths[("s-c2",)] == [1, 2, 9, 8]
    assert paths[("s-c3",)] == [50, 51, 52]


def test_generated_flag_wins_over_context():
    """A token that one call generated and another only saw as context stays trainable."""
    calls = [call("s", 0, [1], [2, 3], logprobs=[-0.5, -0.25]), call("s", 1, [1, 2, 3], [4])]
    forest = build_forest(list(reversed(calls)))
    assert forest.trainable.tolist() == [False, True, True, True]
    assert forest.logprobs[1:3].tolist() == [-0.5, -0.25]


def test_passthrough_calls_are_context_only():
    """trainable=false calls add their tokens as context; empty passthrough calls add nothing."""
    calls = [call("s", 0, [1], [2], trainable=False), call("s", 1, [], [], trainable=False)]
    forest = build_forest(calls)
    assert forest.trainable.tolist() == [False, False]
    assert forest.sessions[0].empty_calls == 1


def test_conflicting_duplicate_call_id_is_an_error():
    """Same call_id with different tokens or logprobs cannot be merged silently."""
    with pytest.raises(ConflictError, match="c-1"):
        build_forest([call("s", 0, [1], [2], call_id="c-1"), call("s", 0, [1], [3], call_id="c-1")])
    with pytest.raises(ConflictError, match="c-1"):
        build_forest(
            [
                call("s", 0, [1], [2], call_id="c-1", logprobs=[-0.5]),
                call("s", 0, [1], [2], call_id="c-1", logprobs=[-0.7]),
            ]
        )
