"""Forest statistics: token counts, branch reasons, drift counters."""

from claw_tree import build_forest, forest_stats, session_stats
from hypothesis import given, settings
from tree_testlib import call, corpora


def test_branch_reasons_are_told_apart():
    """Divergence in earlier output, in context, two samples of one prompt, and a new root."""
    calls = [
        call("s", 0, [1, 2], [3, 4]),
        call("s", 1, [1, 2, 3, 5], [6]),  # diverges inside call 0's output -> "output"
        call("s", 2, [1, 7], [8]),  # diverges inside the prompt -> "context"
        call("s", 3, [1, 7], [9]),  # another sample of the same prompt -> "sampled"
        call("s", 4, [20], [21], trainable=False),  # shares nothing -> "root"
    ]
    stats = forest_stats(build_forest(calls))
    assert stats["branch_reasons"] == {"output": 1, "context": 1, "sampled": 1, "root": 1}
    assert stats["branches"] == 4 == stats["trajectories"] - stats["sessions"]
    assert stats["passthrough_calls"] == 1
    assert stats["trainable_tokens"] == 2 + 1 + 1 + 1
    per = session_stats(build_forest(calls), "s")
    assert per["branches"] == 4 and per["tree_tokens"] == stats["tree_tokens"]


@settings(max_examples=60, deadline=None)
@given(corpora())
def test_counts_are_consistent(data):
    """flat >= tree tokens, ratio is their quotient, branches = trajectories - sessions with tokens."""
    calls, _ = data
    forest = build_forest(calls)
    stats = forest_stats(forest)
    assert stats["flat_tokens"] >= stats["tree_tokens"] == forest.n_nodes
    if stats["flat_tokens"]:
        assert stats["tree_token_ratio"] == stats["tree_tokens"] / stats["flat_tokens"]
    with_tokens = sum(1 for t in forest.sessions if t.n_nodes)
    assert stats["branches"] == stats["trajectories"] - with_tokens
    assert stats["calls"] == len({c["call_id"] for c in calls})


def test_rerender_forks_are_counted_by_reason_and_checked_against_the_tree():
    """Calls the proxy rendered afresh (prefix.fork_reason) are counted by reason, per forest and
    per session; the ones whose prompt does not extend the call they continue (prefix.fork_of)
    are the ones the tree forked at."""
    fork = {"fork_reason": "record_unreadable", "fork_of": "s-c0"}
    calls = [
        call("s", 0, [1, 2], [3, 4]),
        call("s", 1, [1, 2, 5, 6], [7], prefix=fork),  # dropped call 0's output [3, 4]: a fork
        call("s", 2, [1, 2, 5, 6, 7, 8], [9], prefix={**fork, "fork_of": "s-c1"}),  # extends it
        call("t", 0, [1], [2], prefix={"fork_reason": "no_continuation", "fork_of": "gone"}),
    ]
    forest = build_forest(calls)
    stats = forest_stats(forest)
    assert stats["rerender_forks"] == {"no_continuation": 1, "record_unreadable": 2}
    assert stats["rerender_forks_diverged"] == 1
    assert stats["branch_reasons"]["output"] == 1  # the same fork, as the tree sees it
    assert session_stats(forest, "s")["rerender_forks"] == 2
    clean = forest_stats(build_forest([call("s", 0, [1, 2], [3]), call("s", 1, [1, 2, 3, 4], [5])]))
    assert clean["rerender_forks"] == {} and clean["rerender_forks_diverged"] == 0
