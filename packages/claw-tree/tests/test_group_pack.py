"""Group packing (`pack="group"`): one tree per group, the shared context prefix once, and
per token exactly the loss weights, advantages and returns of per-session packing."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from claw_tree import BudgetError, ClawError, build_forest, build_samples, token_sessions
from claw_tree.cli import main
from claw_tree.samples import merge_context_prefixes
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_testlib import call, corpora, outcome, prefix_keys

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _per_token(samples):
    """(session, prefix) -> (loss weight summed over its copies, advantage, logprob, return) of
    every trainable token, and the sorted (session, prefix) keys of the leaves."""
    out, leaves = {}, []
    for s in samples:
        keys = prefix_keys(s["input_ids"], s["parent"])
        owner = token_sessions(s)
        has_child = set(s["parent"])
        for i, key in enumerate(keys):
            name = s["sessions"][owner[i]]
            if i not in has_child:
                leaves.append((name, key))
            if s["trainable"][i]:
                ret = s["returns"][i] if "returns" in s else None
                w, rest = s["loss_weights"][i], (s["advantages"][i], s["logprobs"][i], ret)
                if (name, key) in out:  # a piece of a split session repeats its ancestors
                    assert out[(name, key)][1:] == rest
                    w += out[(name, key)][0]
                out[(name, key)] = (w, *rest)
    return out, sorted(leaves)


@settings(max_examples=80, deadline=None)
@given(
    corpora(max_sessions=6),
    st.sampled_from(["grpo", "ppo", "rloo"]),
    st.sampled_from(["token", "rollout"]),
    st.sampled_from([None, 8, 30]),
    st.sampled_from(["group", "batch"]),
    st.integers(1, 2),
)
def test_group_packing_keeps_every_token_of_session_packing(
    data, algo, weighting, budget, pack, harnesses
):
    """Group and batch packing: every trainable token keeps its loss weight, advantage, logprob
    and return, every leaf (path) survives, no sample passes the budget, and neither ever holds
    more tokens than session packing (groups of two tasks, sessions of one or two harnesses)."""
    calls, outcomes = data
    rng = random.Random(len(calls))
    shared = [rng.randrange(4) for _ in range(rng.randint(1, 6))]  # a common system prompt
    calls = [{**c, "prompt_ids": shared + c["prompt_ids"]} for c in calls]
    outcomes = [{**o, "harness": f"h{k % harnesses}"} for k, o in enumerate(outcomes)]
    forest = build_forest(calls)
    opts = {"algo": algo, "path_weighting": weighting, "max_tokens": budget}
    try:
        by_session = build_samples(forest, outcomes, **opts)
    except BudgetError:
        with pytest.raises(BudgetError):
            build_samples(forest, outcomes, pack=pack, **opts)
        return
    grouped = build_samples(forest, outcomes, pack=pack, **opts)
    want, want_leaves = _per_token(by_session.samples)
    got, got_leaves = _per_token(grouped.samples)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key] == pytest.approx(row), key
    assert got_leaves == want_leaves
    assert grouped.trajectories == by_session.trajectories
    n_group = sum(len(s["input_ids"]) for s in grouped.samples)
    assert n_group <= sum(len(s["input_ids"]) for s in by_session.samples)
    for s in grouped.samples:
        assert len(s["input_ids"]) <= (budget or 10**9)
        assert all(p < i for i, p in enumerate(s["parent"]))
        keys = prefix_keys(s["input_ids"], s["parent"])
        assert s["position_ids"] == [len(k) - 1 for k in keys]
        assert s["tags"]["pack"] == pack
        assert sorted(s["tags"]["session_offsets"]) == s["tags"]["session_offsets"]
    key = "group" if pack == "group" else "harness"
    if budget is None:  # one sample per group (batch: per harness), holding all of its sessions
        owner = {o["session"]: o[key] for o in outcomes}
        assert len(grouped.samples) == len(
            {owner[n] for s in by_session.samples for n in s["sessions"]}
        )
        for s in grouped.samples:
            assert len({owner[name] for name in s["sessions"]}) == 1
        groups = {o["session"]: o["group"] for o in outcomes}
        for s in grouped.samples:
            assert s["groups"] == [groups[name] for name in s["sessions"]]


def _group(n_rollouts: int, prefix: int = 50):
    """n rollouts of one task: a shared system prompt + instruction, two turns each."""
    rng = random.Random(0)
    system = [rng.randrange(10, 100) for _ in range(prefix)]
    calls, outcomes = [], []
    for r in range(n_rollouts):
        name = f"r{r}"
        first = [100 + r, 200 + r]
        tool = [300 + r]
        calls += [
            call(name, 0, system, first),
            call(name, 1, system + first + tool, [400 + r, 500 + r, 600 + r]),
        ]
        outcomes.append(outcome(name, float(r % 2), task="fix-bug"))
    return calls, outcomes, prefix


def test_the_shared_prefix_of_a_group_appears_once():
    """Four rollouts sharing a 50-token prompt: one sample of 50 + 4 x 6 tokens, offsets at each
    rollout's first own token, the prompt's tokens owned by the first rollout."""
    calls, outcomes, prefix = _group(4)
    forest = build_forest(calls)
    sessions = build_samples(forest, outcomes).samples
    (grouped,) = build_samples(forest, outcomes, pack="group").samples
    assert sum(len(s["input_ids"]) for s in sessions) == 4 * (prefix + 6)
    assert len(grouped["input_ids"]) == prefix + 4 * 6
    assert grouped["sessions"] == ["r0", "r1", "r2", "r3"]
    assert grouped["tags"]["session_offsets"] == [0, prefix + 6, prefix + 12, prefix + 18]
    assert grouped["parent"][prefix + 6] == prefix - 1  # r1's first answer hangs off the prompt
    assert sum(grouped["loss_weights"]) == pytest.approx(1.0)
    assert grouped["n_paths"] == 4
    assert sorted(token_sessions(grouped)[grouped["trainable"] == np.int64(1)].tolist()) == sorted(
        np.repeat(np.arange(4), 5).tolist()
    )


def test_budget_spreads_a_group_over_samples_and_counts_merged_tokens():
    """With --max-tokens the merged size counts: 50 + 3 x 6 = 68 fit in 70, the fourth
    rollout opens the next sample."""
    calls, outcomes, prefix = _group(4)
    batch = build_samples(build_forest(calls), outcomes, pack="group", max_tokens=70)
    assert [s["sessions"] for s in batch.samples] == [["r0", "r1", "r2"], ["r3"]]
    assert [len(s["input_ids"]) for s in batch.samples] == [prefix + 18, prefix + 6]


def test_merge_never_touches_trainable_tokens_or_leaves():
    """Two identical context-only leaves stay two leaves; a trainable token equal to another
    rollout's is kept twice (its advantage differs)."""
    parent = np.array([-1, 0, 1, -1, 3, 4, -1, 6, -1, 8])
    tokens = np.array([5, 6, 7, 5, 6, 7, 5, 6, 5, 6])
    trainable = np.zeros(10, dtype=bool)
    trainable[[2, 5]] = True
    keep, merged = merge_context_prefixes(parent, trainable, tokens)
    assert keep.tolist() == [True, True, True, False, False, True, False, True, False, True]
    assert merged.tolist() == [-1, 0, 1, 1, 0, 0]


def test_unknown_pack_is_refused():
    """A pack other than session|group is a ClawError naming the choices."""
    calls, outcomes, _ = _group(2)
    with pytest.raises(ClawError, match="session"):
        build_samples(build_forest(calls), outcomes, pack="task")


def test_cli_pack_group(tmp_path):
    """`claw-tree samples --pack group` writes one line per group that validates against the
    sample schema."""
    calls, outcomes, prefix = _group(3)
    cpath, opath = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    cpath.write_text("".join(json.dumps(c) + "\n" for c in calls))
    opath.write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    result = CliRunner().invoke(main, ["samples", str(cpath), str(opath), "--pack", "group"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in result.stdout.splitlines()]
    assert [len(r["input_ids"]) for r in rows] == [prefix + 3 * 6]
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    assert list(validator.iter_errors(rows[0])) == []


def test_ppo_values_align_with_group_packed_samples():
    """PPO values are read per token of the group-packed sample; with the same value at every
    state the advantages equal those of session packing with the same values."""
    calls, outcomes, _ = _group(3)
    forest = build_forest(calls)
    batches = {}
    for pack in ("session", "group"):
        first = build_samples(forest, outcomes, algo="ppo", pack=pack).samples
        values = {s["sample_id"]: [0.3] * len(s["input_ids"]) for s in first}
        batches[pack] = build_samples(forest, outcomes, algo="ppo", pack=pack, values=values)
    want, _ = _per_token(batches["session"].samples)
    got, _ = _per_token(batches["group"].samples)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key] == pytest.approx(row), key
    assert any(row[1] != 0 for row in got.values())


def _batch(tasks: int, rollouts: int, *, harnesses: int = 1, prefix: int = 50):
    """``tasks`` groups of ``rollouts``: one system prompt per harness (task k runs in harness
    k % harnesses), then each task's own 5-token instruction, two turns per rollout."""
    rng = random.Random(1)
    systems = [[rng.randrange(10, 100) for _ in range(prefix)] for _ in range(harnesses)]
    calls, outcomes = [], []
    for t in range(tasks):
        system = systems[t % harnesses] + [1000 + t] * 5
        for r in range(rollouts):
            name = f"t{t}-r{r}"
            first = [2000 + 10 * t + r, 3000]
            calls += [
                call(name, 0, system, first),
                call(name, 1, system + first + [4000], [5000 + r, 6000 + t]),
            ]
            outcomes.append(
                outcome(name, float((r + t) % 3) / 2, task=f"t{t}", harness=f"h{t % harnesses}")
            )
    return calls, outcomes, prefix


def test_batch_packing_shares_the_harness_prompt_across_groups():
    """Three groups of three rollouts of one harness: one sample in which the 50-token system
    prompt appears once (group packing: once per group), each task's instruction once per
    group; advantages stay group-relative (those of session packing)."""
    calls, outcomes, prefix = _batch(3, 3)
    forest = build_forest(calls)
    own = 4 + 1  # per rollout: 4 completion tokens and one tool result
    sessions = build_samples(forest, outcomes).samples
    grouped = build_samples(forest, outcomes, pack="group").samples
    (batch,) = build_samples(forest, outcomes, pack="batch").samples
    assert sum(len(s["input_ids"]) for s in sessions) == 9 * (prefix + 5 + own)
    assert [len(s["input_ids"]) for s in grouped] == [prefix + 5 + 3 * own] * 3
    assert len(batch["input_ids"]) == prefix + 3 * (5 + 3 * own)
    assert batch["groups"] == ["t0"] * 3 + ["t1"] * 3 + ["t2"] * 3
    assert batch["tags"]["pack"] == "batch"
    assert sum(batch["loss_weights"]) == pytest.approx(1.0)
    want, _ = _per_token(sessions)
    got, _ = _per_token([batch])
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key] == pytest.approx(row), key
    by_group: dict[str, set] = {}
    for (name, _), (_, adv, _, _) in got.items():
        by_group.setdefault(name.split("-")[0], set()).add(round(adv, 9))
    assert all(len(advs) == 3 for advs in by_group.values())  # rewards 0, 0.5, 1 in each group
    for advs in by_group.values():
        assert sum(advs) == pytest.approx(0.0)


def test_batch_packing_keeps_harnesses_apart_and_fills_the_budget():
    """Two harnesses: one sample each (their prompts share nothing); with a budget the merged
    size counts, and groups of one harness fill a sample together."""
    calls, outcomes, prefix = _batch(4, 2, harnesses=2)
    forest = build_forest(calls)
    samples = build_samples(forest, outcomes, pack="batch").samples
    assert [s["tags"]["harnesses"] for s in samples] == [["h0"] * 4, ["h1"] * 4]
    assert [s["groups"] for s in samples] == [["t0", "t0", "t2", "t2"], ["t1", "t1", "t3", "t3"]]
    assert [len(s["input_ids"]) for s in samples] == [prefix + 2 * (5 + 2 * 5)] * 2
    size = prefix + 5 + 2 * 5 + 5 + 5  # t0 whole, then t2's instruction and first rollout
    budgeted = build_samples(forest, outcomes, pack="batch", max_tokens=size).samples
    assert [s["sessions"] for s in budgeted][:2] == [["t0-r0", "t0-r1", "t2-r0"], ["t2-r1"]]
    assert [len(s["input_ids"]) for s in budgeted][:2] == [size, prefix + 5 + 5]


def test_cli_pack_batch(tmp_path):
    """`claw-tree samples --pack batch` writes one line per harness that validates against the
    sample schema."""
    calls, outcomes, prefix = _batch(2, 2)
    cpath, opath = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    cpath.write_text("".join(json.dumps(c) + "\n" for c in calls))
    opath.write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    result = CliRunner().invoke(main, ["samples", str(cpath), str(opath), "--pack", "batch"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in result.stdout.splitlines()]
    assert [len(r["input_ids"]) for r in rows] == [prefix + 2 * (5 + 2 * 5)]
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    assert list(validator.iter_errors(rows[0])) == []
