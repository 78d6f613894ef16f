"""SFT samples from calls alone: exact loss weights against flat per-call / per-path references,
rejection-sampling filters, schema, CLI."""

import json
import random
from pathlib import Path

import pytest
from claw_tree import BudgetError, ClawError, build_forest, build_sft_samples, token_sessions
from claw_tree.cli import main
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_testlib import call, corpora, outcome, prefix_keys

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _generated(calls):
    """Flat per-call reference: the (session, prefix) key of every token a trainable call
    generated (completion tokens, never a root), duplicates by call_id once."""
    unique = {c["call_id"]: c for c in calls}
    keys = set()
    for c in unique.values():
        if c.get("trainable", True):
            seq = c["prompt_ids"] + c["completion_ids"]
            for k in range(max(len(c["prompt_ids"]), 1), len(seq)):
                keys.add((c["session"], tuple(seq[: k + 1])))
    return keys


def _paths(calls):
    """Flat per-path reference: per session, every distinct call sequence that is not a strict
    prefix of another one, as a list of (session, prefix) keys."""
    by_session = {}
    for c in {c["call_id"]: c for c in calls}.values():
        seq = tuple(c["prompt_ids"] + c["completion_ids"])
        if seq:
            by_session.setdefault(c["session"], set()).add(seq)
    out = []
    for s, seqs in by_session.items():
        for q in seqs:
            if not any(len(o) > len(q) and o[: len(q)] == q for o in seqs):
                out.append([(s, q[: k + 1]) for k in range(len(q))])
    return out


def _packed(samples, loss):
    total = 0.0
    for s in samples:
        owner = token_sessions(s)
        for i, key in enumerate(prefix_keys(s["input_ids"], s["parent"])):
            total += s["loss_weights"][i] * loss.get((s["sessions"][owner[i]], key), 0.0)
    return total


@settings(max_examples=150, deadline=None)
@given(
    corpora(),
    st.sampled_from(["token", "path"]),
    st.sampled_from([None, 3, 8, 50]),
    st.sampled_from(["session", "group", "batch"]),
)
def test_packed_sft_loss_equals_the_flat_loss(data, weighting, budget, pack):
    """sum_i w_i l_i equals the token-mean loss over every call's generated tokens (token) or over
    every trajectory's trainable tokens, a shared token once per path (path), at any budget,
    with sessions in their own trees or sharing their context prefixes (group)."""
    calls, _ = data
    gen = _generated(calls)
    paths = [p for p in _paths(calls) if any(k in gen for k in p)]
    if budget is not None and max((len(p) for p in paths), default=0) > budget:
        with pytest.raises(BudgetError):
            build_sft_samples(
                build_forest(calls), weighting=weighting, max_tokens=budget, pack=pack
            )
        return
    batch = build_sft_samples(
        build_forest(calls), weighting=weighting, max_tokens=budget, pack=pack
    )
    rng = random.Random(len(gen))
    loss = {k: rng.uniform(-2, 2) for k in sorted(gen)}
    if weighting == "token":
        want = sum(loss.values()) / len(gen) if gen else 0.0
    else:
        targets = [loss[k] for p in paths for k in p if k in gen]
        want = sum(targets) / len(targets) if targets else 0.0
    assert _packed(batch.samples, loss) == pytest.approx(want, abs=1e-9)
    assert batch.trajectories == len(paths)
    for s in batch.samples:
        assert s["algo"] == "sft"
        assert set(s["advantages"]) == {0.0}
        assert all(w > 0 for w, t in zip(s["loss_weights"], s["trainable"], strict=True) if t)
        assert len(s["input_ids"]) <= (budget or 10**9)
        assert all(p < i for i, p in enumerate(s["parent"]))
        keys = prefix_keys(s["input_ids"], s["parent"])
        assert s["position_ids"] == [len(k) - 1 for k in keys]


def test_shared_prefix_is_packed_once_and_weighted_per_choice():
    """A completion that two later calls continue from lies once in the sample; per token it
    weighs like every other generated token, per path it weighs once per path through it."""
    calls = [
        call("a", 0, [1, 2], [3, 4]),
        call("a", 1, [1, 2, 3, 4, 5], [6]),
        call("a", 2, [1, 2, 3, 7], [8]),
    ]
    forest = build_forest(calls)
    (tok,) = build_sft_samples(forest).samples
    assert tok["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert tok["loss_weights"] == pytest.approx([0, 0, 0.25, 0.25, 0, 0.25, 0, 0.25])
    (path,) = build_sft_samples(forest, weighting="path").samples
    # paths 1-2-3-4-5-6 (targets 3, 4, 6) and 1-2-3-7-8 (targets 3, 8): 5 targets in all
    assert path["loss_weights"] == pytest.approx([0, 0, 0.4, 0.2, 0, 0.2, 0, 0.2])
    assert tok["tags"]["sft_weighting"] == "token" and path["tags"]["sft_weighting"] == "path"
    assert tok["tags"]["tasks"] == ["t"] and tok["tags"]["harnesses"] == ["h"]


def test_passed_only_keeps_the_rollouts_that_passed():
    """With outcomes and passed_only, failed, infra-error and unscored sessions are left out and
    named with the reason; without passed_only a failed but ok rollout stays."""
    calls = [call(s, 0, [1, 2], [3 + k]) for k, s in enumerate("abcd")]
    outcomes = [outcome("a", 1.0), outcome("b", 0.0), outcome("c", 0.0, status="infra_error")]
    forest = build_forest(calls)
    batch = build_sft_samples(forest, outcomes=outcomes, passed_only=True)
    assert [s["sessions"] for s in batch.samples] == [["a"]]
    assert batch.excluded == {"b": "not passed", "c": "status infra_error", "d": "no outcome"}
    kept = build_sft_samples(forest, outcomes=outcomes)
    assert [s["sessions"] for s in kept.samples] == [["a"], ["b"]]
    assert sum(kept.samples[0]["loss_weights"] + kept.samples[1]["loss_weights"]) == 1.0
    assert build_sft_samples(forest).rollouts == 4
    with pytest.raises(ClawError, match="outcomes"):
        build_sft_samples(forest, passed_only=True)


def test_sft_samples_carry_no_sampling_settings():
    """Calls sampled at other settings still give samples without temperatures (NLL at T = 1)."""
    row = call("a", 0, [1, 2], [3, 4])
    row["sampling"] = {"temperature": 0.0, "top_p": 0.5, "top_k": 3, "forced": False}
    (s,) = build_sft_samples(build_forest([row])).samples
    assert "temperatures" not in s and s["trainable"] == [0, 0, 1, 1]


def test_sft_samples_validate_against_the_schema():
    """Every SFT sample satisfies formats/claw.sample.v1.schema.json."""
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    calls = [call("a", 0, [1, 2], [3]), call("a", 1, [1, 2, 3, 4], [5]), call("b", 0, [1], [6])]
    for kw in (
        {},
        {"weighting": "path", "max_tokens": 5},
        {"outcomes": [outcome("a", 1.0)]},
        {"pack": "group", "max_tokens": 9},
    ):
        for s in build_sft_samples(build_forest(calls), **kw).samples:
            assert list(validator.iter_errors(json.loads(json.dumps(s)))) == []


def test_cli_sft_samples_from_calls_and_with_passed_only(tmp_path):
    """`claw-tree sft-samples` writes algo-sft lines from calls alone; --passed-only filters by
    the outcomes and reports the rest on stderr; --passed-only without --outcomes is a usage error."""
    cpath, opath = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    cpath.write_text("".join(json.dumps(call(s, 0, [1, 2], [3])) + "\n" for s in "ab"))
    opath.write_text(json.dumps(outcome("a", 1.0)) + "\n" + json.dumps(outcome("b", 0.0)) + "\n")
    out = tmp_path / "sft.jsonl"
    r = CliRunner().invoke(main, ["sft-samples", str(cpath), "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["algo"], x["sessions"]) for x in rows] == [("sft", ["a"]), ("sft", ["b"])]
    r = CliRunner().invoke(
        main, ["sft-samples", str(cpath), "--outcomes", str(opath), "--passed-only"]
    )
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["sessions"] for line in r.stdout.splitlines()] == [["a"]]
    assert "excluded b: not passed" in r.stderr
    r = CliRunner().invoke(main, ["sft-samples", str(cpath), "--passed-only"])
    assert r.exit_code == 2 and "--outcomes" in r.output


def test_group_packing_shares_the_context_prefix_of_sessions():
    """With --pack group, sessions with the same system prompt share it in one tree: fewer
    tokens, the same targets and weights as one tree per session."""
    system = [1, 5, 6, 7, 8, 9]
    calls = [call(s, 0, [*system, 20 + k], [30 + k, 31]) for k, s in enumerate("abcd")]
    forest = build_forest(calls)
    alone = build_sft_samples(forest).samples
    (merged,) = build_sft_samples(forest, pack="group").samples
    assert (
        sum(len(s["input_ids"]) for s in alone) == 4 * 9 and len(merged["input_ids"]) == 6 + 4 * 3
    )
    assert merged["sessions"] == ["a", "b", "c", "d"] and merged["tags"]["pack"] == "group"
    targets = [
        (t, w)
        for s in alone
        for t, w, x in zip(s["input_ids"], s["loss_weights"], s["trainable"], strict=True)
        if x
    ]
    merged_targets = [
        (t, w)
        for t, w, x in zip(
            merged["input_ids"], merged["loss_weights"], merged["trainable"], strict=True
        )
        if x
    ]
    assert sorted(targets) == sorted(merged_targets)
    assert len(build_sft_samples(forest, pack="group", max_tokens=12).samples) == 2
    (batch,) = build_sft_samples(forest, pack="batch").samples  # no groups: batch = group
    assert (batch["input_ids"], batch["parent"]) == (merged["input_ids"], merged["parent"])
    assert batch["loss_weights"] == merged["loss_weights"] and batch["tags"]["pack"] == "batch"
