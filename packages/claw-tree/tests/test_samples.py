"""Tree-packed samples: exact loss weights, advantages per token, budgets, PPO values, schema."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from claw_tree import (
    BudgetError,
    ClawError,
    ValuesError,
    build_forest,
    build_samples,
    gae_for_samples,
    group_relative_advantages,
    make_samples,
    sample_rewards,
    token_sessions,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_testlib import call, corpora, flat_gae, outcome, prefix_keys

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _flat_trajectories(calls):
    """Reference trajectories without a tree: per session, every distinct call sequence that is
    not a strict prefix of another one; per token its (session, prefix) key and trainable flag."""
    unique = {c["call_id"]: c for c in calls}
    by_session = {}
    for c in unique.values():
        seq = tuple(c["prompt_ids"] + c["completion_ids"])
        if seq:
            by_session.setdefault(c["session"], set()).add(seq)
    gen = set()
    for c in unique.values():
        if c.get("trainable", True):
            seq = c["prompt_ids"] + c["completion_ids"]
            for k in range(len(c["prompt_ids"]), len(seq)):
                gen.add((c["session"], tuple(seq[: k + 1])))
    out = {}
    for s, seqs in by_session.items():
        leaves = [q for q in seqs if not any(len(o) > len(q) and o[: len(q)] == q for o in seqs)]
        out[s] = [
            [((s, q[: k + 1]), (s, q[: k + 1]) in gen) for k in range(len(q))]
            for q in sorted(leaves)
        ]
    return out


def _random_loss(keys):
    rng = random.Random(hash(tuple(sorted(keys))) & 0xFFFF)
    return {k: rng.uniform(-2, 2) for k in sorted(keys)}


def _packed_loss(samples, loss):
    total = 0.0
    for s in samples:
        keys = prefix_keys(s["input_ids"], s["parent"])
        owner = token_sessions(s)
        for i, key in enumerate(keys):
            total += s["loss_weights"][i] * loss[(s["sessions"][owner[i]], key)]
    return total


@settings(max_examples=120, deadline=None)
@given(corpora(), st.sampled_from(["token", "rollout", "path"]), st.sampled_from([None, 3, 8, 50]))
def test_packed_loss_equals_flat_per_trajectory_mean(data, weighting, budget):
    """sum_i w_i l_i over the batch equals, for any token budget: the mean over rollouts of each
    rollout's mean over its distinct trainable tokens (token), or the (rollout- or path-)
    weighted mean over trajectories of each trajectory's mean trainable-token loss."""
    calls, outcomes = data
    flat = _flat_trajectories(calls)
    per_session = {s: [p for p in paths if any(g for _, g in p)] for s, paths in flat.items()}
    per_session = {s: p for s, p in per_session.items() if p}
    longest = max((len(p) for paths in per_session.values() for p in paths), default=0)
    if budget is not None and longest > budget:
        with pytest.raises(BudgetError):
            build_samples(
                build_forest(calls), outcomes, path_weighting=weighting, max_tokens=budget
            )
        return
    batch = build_samples(
        build_forest(calls), outcomes, path_weighting=weighting, max_tokens=budget
    )
    keys = {k for paths in flat.values() for p in paths for k, _ in p}
    loss = _random_loss(keys)
    n_paths = sum(len(p) for p in per_session.values())
    want = 0.0
    for paths in per_session.values():
        if weighting == "token":
            distinct = {k for p in paths for k, g in p if g}
            want += sum(loss[k] for k in distinct) / len(distinct) / len(per_session)
            continue
        for p in paths:
            W = 1 / n_paths if weighting == "path" else 1 / (len(per_session) * len(paths))
            trained = [loss[k] for k, g in p if g]
            want += W * sum(trained) / len(trained)
    assert _packed_loss(batch.samples, loss) == pytest.approx(want, abs=1e-9)
    assert batch.trajectories == n_paths
    for s in batch.samples:
        assert len(s["input_ids"]) <= (budget or 10**9)
        keys_s = prefix_keys(s["input_ids"], s["parent"])
        tagged = [(s["sessions"][j], k) for j, k in zip(token_sessions(s), keys_s, strict=True)]
        assert len(set(tagged)) == len(tagged), "a node appears twice in one sample"
        assert all(p < i for i, p in enumerate(s["parent"]))
        assert s["position_ids"] == [len(k) - 1 for k in keys_s]


@settings(max_examples=80, deadline=None)
@given(corpora(), st.sampled_from(["grpo", "rloo", "reinforce"]))
def test_token_advantages_are_the_rollout_advantage(data, algo):
    """Outcome algorithms give every trainable token its rollout's advantage, context 0; GRPO
    statistics take one vote per rollout whatever its number of paths."""
    calls, outcomes = data
    samples = make_samples(build_forest(calls), outcomes, algo=algo)
    rewards = {o["session"]: o["reward"] for o in outcomes}
    groups = {o["session"]: o["group"] for o in outcomes}
    names = sorted(rewards)
    r = np.array([rewards[s] for s in names])
    if algo == "grpo":
        ref = dict(
            zip(
                names,
                group_relative_advantages(r, np.array([groups[s] for s in names])),
                strict=True,
            )
        )
    elif algo == "rloo":
        ref = {}
        for s in names:
            others = [rewards[o] for o in names if o != s and groups[o] == groups[s]]
            ref[s] = rewards[s] - sum(others) / len(others) if others else 0.0
    else:
        ref = rewards
    for s in samples:
        owner = token_sessions(s)
        for i, t in enumerate(s["trainable"]):
            want = ref[s["sessions"][owner[i]]] if t else 0.0
            assert s["advantages"][i] == pytest.approx(want)


def test_single_chain_equals_plain_grpo():
    """One chain per rollout: token advantages are plain GRPO, weights 1/(R * n_trainable)."""
    calls, outcomes = [], []
    for k, reward in enumerate([1.0, 0.0, 0.0, 1.0]):
        calls += [call(f"s{k}", 0, [1, 2], [3 + k, 4]), call(f"s{k}", 1, [1, 2, 3 + k, 4, 9], [5])]
        outcomes.append(outcome(f"s{k}", reward))
    samples = make_samples(build_forest(calls), outcomes)
    assert [s["advantages"][-1] for s in samples] == pytest.approx([1, -1, -1, 1], abs=1e-5)
    for s in samples:
        assert s["n_paths"] == 1
        assert s["loss_weights"] == pytest.approx([0, 0, 1 / 12, 1 / 12, 0, 1 / 12])


def test_token_weighting_gives_every_sampled_token_of_a_rollout_the_same_weight():
    """A 20-token main path and three 2-token side calls: by default every trainable token weighs
    1/26 of the rollout's vote (side calls 6/26); split per path they would carry 3/4 of it."""
    main = [call("s", 0, [1, 2], list(range(10, 30)))]
    side = [call("s", k, [1, 3, k], [40 + k, 50 + k], call_id=f"side{k}") for k in (1, 2, 3)]
    forest = build_forest(main + side)
    by_token = make_samples(forest, [outcome("s", 1.0)])[0]
    w = [x for x, t in zip(by_token["loss_weights"], by_token["trainable"], strict=True) if t]
    assert len(w) == 26 and w == pytest.approx([1 / 26] * 26)
    assert by_token["tags"]["path_weighting"] == "token"
    by_path = make_samples(forest, [outcome("s", 1.0)], path_weighting="rollout")[0]
    side_ids = {41, 42, 43, 51, 52, 53}
    side_w = sum(
        x
        for x, i in zip(by_path["loss_weights"], by_path["input_ids"], strict=True)
        if i in side_ids
    )
    assert side_w == pytest.approx(3 / 4)


def test_token_weighting_splits_a_shared_token_over_pieces():
    """A shared trainable token repeated in two budget pieces keeps its total weight 1/(R U)."""
    calls = [
        call("s", 0, [1], [2, 3]),
        call("s", 1, [1, 2, 3, 4], [5, 6], call_id="x"),
        call("s", 2, [1, 2, 3, 7], [8, 9], call_id="y"),
    ]
    whole = make_samples(build_forest(calls), [outcome("s", 1.0)])
    pieces = make_samples(build_forest(calls), [outcome("s", 1.0)], max_tokens=6)
    assert len(whole) == 1 and len(pieces) == 2
    for samples in (whole, pieces):
        total = {}
        for smp in samples:
            for key, w in zip(
                prefix_keys(smp["input_ids"], smp["parent"]), smp["loss_weights"], strict=True
            ):
                total[key] = total.get(key, 0.0) + w
        trained = [w for w in total.values() if w > 0]
        assert len(trained) == 6 and trained == pytest.approx([1 / 6] * 6)


def test_paths_are_accepted_for_calls_and_outcomes(tmp_path):
    """build_forest and make_samples read JSONL paths too."""
    (tmp_path / "c.jsonl").write_text(json.dumps(call("s", 0, [1], [2])) + "\n")
    (tmp_path / "o.jsonl").write_text(json.dumps(outcome("s", 1.0)) + "\n")
    samples = make_samples(
        build_forest(tmp_path / "c.jsonl"), str(tmp_path / "o.jsonl"), algo="reinforce"
    )
    assert samples[0]["advantages"] == [0.0, 1.0]


def test_excluded_rollouts_are_reported_not_trained():
    """infra_error / not_scorable / missing outcomes are left out of groups and samples, with reasons."""
    calls = [call(s, 0, [1], [2]) for s in ("ok1", "ok2", "infra", "noscore", "orphan")]
    outcomes = [
        outcome("ok1", 1.0),
        outcome("ok2", 0.0),
        outcome("infra", 0, status="infra_error"),
        outcome("noscore", 0, status="not_scorable"),
        outcome("nocalls", 1.0),
    ]
    batch = build_samples(build_forest(calls), outcomes)
    assert [s["sessions"] for s in batch.samples] == [["ok1"], ["ok2"]]
    assert batch.excluded == {
        "infra": "status infra_error",
        "noscore": "status not_scorable",
        "orphan": "no outcome",
        "nocalls": "no calls",
    }
    assert batch.rollouts == 3  # ok1, ok2 and nocalls vote in the group statistics
    assert "excluded sessions" in batch.summary()


def test_a_batch_without_learning_signal_says_so(caplog):
    """Equal rewards in every group: every advantage is exactly 0 and the summary (and
    make_samples' warning) says there is no learning signal; one group with spread has signal."""
    calls = [call(f"s{k}", 0, [1], [2 + k]) for k in range(4)]
    same = [outcome(f"s{k}", 0.1, task="a" if k < 2 else "b") for k in range(4)]
    batch = build_samples(build_forest(calls), same)
    assert all(a == 0 for smp in batch.samples for a in smp["advantages"])
    assert batch.no_signal and batch.no_signal.startswith("every advantage is 0")
    assert "NO LEARNING SIGNAL" in batch.summary() and "2 groups with zero" in batch.summary()
    with caplog.at_level("WARNING", logger="claw_tree"):
        make_samples(build_forest(calls), same)
    assert "NO LEARNING SIGNAL" in caplog.text
    mixed = [*same[:2], outcome("s2", 1.0, task="b"), outcome("s3", 0.0, task="b")]
    batch = build_samples(build_forest(calls), mixed)
    assert batch.no_signal is None and "SIGNAL" not in batch.summary()
    assert build_samples(build_forest(calls), []).no_signal.startswith("no samples")


def test_turn_level_gae_through_samples_and_values():
    """gae_level="turn": V = 0, terminal reward 1, lam = 0.5: the first call's tokens get 0.5, the
    second call's 1.0; gae_for_samples on the samples gives what build_samples(values=...) gives."""
    calls = [call("s", 0, [1, 2], [3, 4, 5]), call("s", 1, [1, 2, 3, 4, 5, 6], [7, 8])]
    forest = build_forest(calls)
    first = build_samples(
        forest, [outcome("s", 1.0)], algo="ppo", lam=0.5, gae_level="turn"
    ).samples
    adv = [a for a, t in zip(first[0]["advantages"], first[0]["trainable"], strict=True) if t]
    assert adv == pytest.approx([0.5, 0.5, 0.5, 1.0, 1.0])
    values = {first[0]["sample_id"]: [0.1 * i for i in range(len(first[0]["input_ids"]))]}
    whole = build_samples(
        forest, [outcome("s", 1.0)], algo="ppo", values=values, lam=0.5, gae_level="turn"
    )
    again = gae_for_samples(first, values, lam=0.5, gae_level="turn")
    assert again[0]["advantages"] == pytest.approx(whole.samples[0]["advantages"])
    assert again[0]["returns"] == pytest.approx(whole.samples[0]["returns"])
    with pytest.raises(ClawError, match="gae_level"):
        build_samples(forest, [outcome("s", 1.0)], algo="ppo", gae_level="call")


def test_ppo_values_roundtrip_and_match_per_path_gae():
    """PPO: values aligned to this batch's samples give GAE that matches the per-path loop
    on a branching session (both branches share the bootstrap through the mean)."""
    calls = [
        call("s", 0, [1, 2], [3, 4]),
        call("s", 1, [1, 2, 3, 4, 5], [6, 7]),
        call("s", 2, [1, 2, 3, 4, 8], [9]),
    ]
    forest = build_forest(calls)
    first = build_samples(forest, [outcome("s", 1.0)], algo="ppo")
    sample = first.samples[0]
    values = {sample["sample_id"]: [0.1 * i for i in range(len(sample["input_ids"]))]}
    batch = build_samples(
        forest, [outcome("s", 1.0)], algo="ppo", values=values, gamma=0.9, lam=0.8
    )
    got = batch.samples[0]
    V = np.array(values[sample["sample_id"]])
    act = np.array(got["trainable"], dtype=bool)
    r = sample_rewards(got)
    assert r.tolist() == [0, 0, 0, 0, 0, 0, 1.0, 0, 1.0]
    parent = got["parent"]
    kids = {i: [j for j, p in enumerate(parent) if p == i] for i in range(len(parent))}

    def leaves_below(v, prob):
        if not kids[v]:
            yield v, prob
        for c in kids[v]:
            yield from leaves_below(c, prob / len(kids[v]))

    def path_to(v):
        return path_to(parent[v]) + [v] if v >= 0 else []

    want = np.zeros(len(parent))
    for v in np.flatnonzero(act):
        for leaf, prob in leaves_below(v, 1.0):
            path = path_to(leaf)
            want[v] += prob * flat_gae(act[path], V[path], r[path], 0.9, 0.8)[path.index(v)]
    assert len([v for v in kids if len(kids[v]) > 1]) == 1
    assert np.allclose(got["advantages"], want)
    assert np.allclose(got["returns"], np.where(act, want + V, 0.0))
    again = gae_for_samples(first.samples, values, gamma=0.9, lam=0.8)
    assert np.allclose(again[0]["advantages"], got["advantages"])


def test_values_that_do_not_match_are_rejected():
    """Values for unknown samples or of the wrong length name the sample."""
    forest = build_forest([call("s", 0, [1], [2])])
    with pytest.raises(ValuesError, match="unknown"):
        build_samples(forest, [outcome("s", 1.0)], algo="ppo", values={"ppo-0": [0, 0], "x": [1]})
    with pytest.raises(ValuesError, match="ppo-0"):
        build_samples(forest, [outcome("s", 1.0)], algo="ppo", values={"ppo-0": [0.0]})


def test_samples_validate_against_the_schema():
    """Every emitted sample satisfies formats/claw.sample.v1.schema.json."""
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    calls = [
        call("a", 0, [1, 2], [3]),
        call("a", 1, [1, 2, 3, 4], [5]),
        call("a", 2, [1, 7], [8]),
        call("b", 0, [1, 2], [6]),
    ]
    outcomes = [outcome("a", 1.0), outcome("b", 0.0)]
    for algo in ("grpo", "ppo", "rloo", "reinforce"):
        for s in make_samples(build_forest(calls), outcomes, algo=algo, max_tokens=9):
            assert list(validator.iter_errors(json.loads(json.dumps(s)))) == []


@settings(max_examples=60, deadline=None)
@given(corpora(), st.sampled_from([12, 30]))
def test_ppo_on_split_sessions_equals_unsplit(data, budget):
    """With a token budget that splits sessions, PPO advantages and returns per (session, prefix)
    are those of the whole tree: GAE runs on the forest, values of repeated nodes are averaged."""
    calls, outcomes = data
    forest = build_forest(calls)

    def by_key(samples):
        out = {}
        for s in samples:
            for j, key, a, r in zip(
                token_sessions(s),
                prefix_keys(s["input_ids"], s["parent"]),
                s["advantages"],
                s["returns"],
                strict=True,
            ):
                out.setdefault((s["sessions"][j], key), set()).add((round(a, 9), round(r, 9)))
        return out

    def values_for(samples):
        return {
            s["sample_id"]: [
                (hash(k) % 1000) / 1000 for k in prefix_keys(s["input_ids"], s["parent"])
            ]
            for s in samples
        }

    try:
        split = build_samples(forest, outcomes, algo="ppo", max_tokens=budget).samples
    except BudgetError:
        return
    whole = build_samples(forest, outcomes, algo="ppo").samples
    got = by_key(
        build_samples(
            forest,
            outcomes,
            algo="ppo",
            max_tokens=budget,
            values=values_for(split),
            gamma=0.9,
            lam=0.7,
        ).samples
    )
    want = by_key(
        build_samples(
            forest, outcomes, algo="ppo", values=values_for(whole), gamma=0.9, lam=0.7
        ).samples
    )
    assert got.keys() <= want.keys()
    assert all(len(v) == 1 and v == want[k] for k, v in got.items())


def _with_sampling(row, **settings):
    return {
        **row,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "forced": False, **settings},
    }


def test_sampling_settings_follow_the_call_that_generated_each_token():
    """temperatures/top_ps/top_ks hold the generating call's settings per token, 1/1/0 on context."""
    calls = [
        _with_sampling(call("a", 0, [1, 2], [3, 4]), temperature=0.7, top_p=0.9),
        _with_sampling(call("a", 1, [1, 2, 3, 4, 5], [6]), temperature=0.0),
        _with_sampling(call("a", 2, [1, 2, 3, 4, 5, 6, 7], [8, 9]), top_k=5),
        _with_sampling(call("a", 3, [1, 11], [10]), temperature=1.3, top_k=3),
    ]
    calls[3]["trainable"] = False
    (sample,) = make_samples(build_forest(calls), [outcome("a", 1.0)])
    by_token = {
        tok: (t, p, k)
        for tok, t, p, k in zip(
            sample["input_ids"],
            sample["temperatures"],
            sample["top_ps"],
            sample["top_ks"],
            strict=True,
        )
    }
    assert {tok: by_token[tok] for tok in (3, 4)} == {3: (0.7, 0.9, 0), 4: (0.7, 0.9, 0)}
    assert by_token[6] == (0.0, 1.0, 0)
    assert by_token[8] == by_token[9] == (1.0, 1.0, 5)
    for context in (1, 2, 5, 7, 11, 10):  # prompt tokens and the untrainable call's token
        assert by_token[context] == (1.0, 1.0, 0)
    assert (
        len(sample["temperatures"])
        == len(sample["top_ps"])
        == len(sample["top_ks"])
        == len(sample["input_ids"])
    )
    assert all(isinstance(k, int) for k in sample["top_ks"])


def test_default_sampling_adds_no_fields():
    """Calls sampled at 1/1/0 (or without a sampling field) give samples without the arrays."""
    calls = [_with_sampling(call("a", 0, [1, 2], [3, 4])), call("a", 1, [1, 2, 3, 4, 5], [6])]
    (sample,) = make_samples(build_forest(calls), [outcome("a", 1.0)])
    assert not {"temperatures", "top_ps", "top_ks"} & set(sample)


def test_samples_with_sampling_settings_validate_against_the_schema():
    """Samples carrying per-token sampling settings satisfy the claw.sample/v1 schema."""
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = FORMATS / "claw.sample.v1.schema.json"
    if not schema_path.exists():
        pytest.skip("formats/ not next to this package")
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    calls = [
        _with_sampling(call("a", 0, [1, 2], [3]), temperature=0.6, top_k=4),
        call("b", 0, [1, 2], [6]),
    ]
    for s in make_samples(
        build_forest(calls), [outcome("a", 1.0), outcome("b", 0.0)], max_tokens=9
    ):
        assert "temperatures" in s
        assert list(validator.iter_errors(json.loads(json.dumps(s)))) == []
