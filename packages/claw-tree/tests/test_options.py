"""SampleOptions: one frozen, validated options object for RL and SFT samples; the keyword
form of build_samples / build_sft_samples and the CLI flags map onto it."""

import json
import random

import attrs
import pytest
from claw_tree import (
    ClawError,
    SampleOptions,
    build_forest,
    build_samples,
    build_sft_samples,
)
from claw_tree.cli import main
from click.testing import CliRunner
from tree_testlib import outcome, random_session


def _corpus(seed=7):
    rng = random.Random(seed)
    calls, outcomes = [], []
    for s in range(5):
        calls += random_session(rng, f"s{s}", 4)
        outcomes.append(outcome(f"s{s}", float(s % 2), group=f"g{s % 2}"))
    return calls, outcomes


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"algo": "ppo", "pack": "group", "max_tokens": 40, "gamma": 0.9, "gae_level": "turn"},
        {"algo": "rloo", "path_weighting": "rollout", "group_by": "task", "id_prefix": "b3"},
        {"algo": "reinforce", "baseline": 0.25, "path_weighting": "path", "max_tokens": 25},
    ],
)
def test_keywords_are_the_options(fields):
    """build_samples(**fields) gives exactly what build_samples(SampleOptions(...)) gives, and
    keywords next to an options object replace its fields."""
    calls, outcomes = _corpus()
    forest = build_forest(calls)
    as_fields = dict(fields)
    if "path_weighting" in as_fields:
        as_fields["weighting"] = as_fields.pop("path_weighting")
    by_keywords = build_samples(forest, outcomes, **fields)
    by_options = build_samples(forest, outcomes, SampleOptions(**as_fields))
    assert by_keywords.samples and by_keywords.samples == by_options.samples
    assert by_keywords.excluded == by_options.excluded
    base = SampleOptions(algo="rloo", id_prefix="z", max_tokens=60)
    overridden = build_samples(forest, outcomes, base, **fields)
    expected = build_samples(forest, outcomes, attrs.evolve(base, **as_fields))
    assert overridden.samples == expected.samples


def test_sft_options():
    """build_sft_samples takes SampleOptions(algo="sft") or its fields; the default prefix is sft."""
    calls, outcomes = _corpus()
    forest = build_forest(calls)
    opts = SampleOptions(algo="sft", weighting="path", pack="group", max_tokens=30)
    by_options = build_sft_samples(forest, outcomes=outcomes, options=opts)
    by_keywords = build_sft_samples(
        forest, outcomes=outcomes, weighting="path", pack="group", max_tokens=30
    )
    assert by_options.samples and by_options.samples == by_keywords.samples
    assert by_options.samples[0]["sample_id"] == "sft-0"
    assert by_options.samples[0]["tags"]["sft_weighting"] == "path"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algo": "dpo"}, "algo must be one of"),
        ({"group_by": "harness"}, "group_by must be one of"),
        ({"weighting": "tokens"}, "path_weighting must be one of"),
        ({"algo": "sft", "weighting": "rollout"}, "weighting must be one of \\('token', 'path'\\)"),
        ({"max_tokens": 0}, "max_tokens must be positive"),
        ({"pack": "task"}, "pack must be one of"),
        ({"gae_level": "call"}, "gae_level must be one of"),
        ({"passed_only": True}, "passed_only is an SFT option"),
    ],
)
def test_bad_options_say_which_field(fields, message):
    """An invalid field is a ClawError naming the field, when the options are made."""
    with pytest.raises(ClawError, match=message):
        SampleOptions(**fields)


def test_options_are_frozen_and_each_packer_checks_its_algo():
    """Options cannot change after validation; RL options are refused by the SFT packer and the
    other way round; an unknown keyword is a TypeError."""
    opts = SampleOptions()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        opts.max_tokens = 3  # type: ignore[misc]
    calls, outcomes = _corpus()
    forest = build_forest(calls)
    with pytest.raises(ClawError, match="build_sft_samples"):
        build_samples(forest, outcomes, SampleOptions(algo="sft"))
    with pytest.raises(ClawError, match="needs algo='sft'"):
        build_sft_samples(forest, options=SampleOptions(algo="grpo"))
    with pytest.raises(TypeError):
        build_samples(forest, outcomes, max_token=3)


def test_cli_flags_map_onto_the_options(tmp_path):
    """`claw-tree samples` and `sft-samples` write what the library writes for the same options."""
    calls, outcomes = _corpus()
    calls_path, outcomes_path = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    calls_path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    outcomes_path.write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    forest = build_forest(calls)
    runner = CliRunner()
    args = ["--algo", "rloo", "--path-weighting", "rollout", "--pack", "group", "--id-prefix", "x"]
    result = runner.invoke(main, ["samples", *args, str(calls_path), str(outcomes_path)])
    assert result.exit_code == 0, result.output
    opts = SampleOptions(algo="rloo", weighting="rollout", pack="group", id_prefix="x")
    expected = build_samples(forest, outcomes, opts).samples
    assert [json.loads(line) for line in result.stdout.splitlines()] == expected
    args = ["--weighting", "path", "--max-tokens", "30", "--outcomes", str(outcomes_path)]
    result = runner.invoke(main, ["sft-samples", *args, str(calls_path)])
    assert result.exit_code == 0, result.output
    opts = SampleOptions(algo="sft", weighting="path", max_tokens=30)
    expected = build_sft_samples(forest, outcomes=outcomes, options=opts).samples
    assert [json.loads(line) for line in result.stdout.splitlines()] == expected
