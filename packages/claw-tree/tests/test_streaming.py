"""Samples written one at a time (stream_samples, `claw-tree samples`) are those of build_samples,
byte for byte, and records hold token ids as int32."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
from claw_tree import (
    BudgetError,
    ConflictError,
    RecordError,
    build_forest,
    build_samples,
    build_sft_samples,
    read_calls,
    write_jsonl,
)
from claw_tree.cli import main
from claw_tree.corpus import index_calls, stream_file_samples, stream_indexed_samples
from claw_tree.samples import SampleTally, stream_samples
from claw_tree.sft import stream_sft_samples
from click.testing import CliRunner
from tree_testlib import outcome, random_session

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def _corpus(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Random sessions of two harnesses and three groups, some sampled at temperature 0.7, one
    rollout not ok, one without an outcome."""
    rng = random.Random(seed)
    calls, outcomes = [], []
    for s in range(9):
        name = f"s{s}"
        rows = random_session(rng, name, rng.randint(2, 7), alphabet=5)
        if s % 4 == 1:
            for row in rows:
                row["sampling"] = {"temperature": 0.7}
        calls += rows
        if s != 8:
            status = "infra_error" if s == 5 else "ok"
            outcomes.append(
                outcome(
                    name,
                    float(rng.choice([0.0, 0.5, 1.0])),
                    task=f"task{s % 3}",
                    harness=f"h{s % 2}",
                    status=status,
                )
            )
    rng.shuffle(calls)
    return calls, outcomes


def _text(rows) -> str:
    out = io.StringIO()
    write_jsonl(rows, out)
    return out.getvalue()


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "ppo"])
@pytest.mark.parametrize("pack", ["session", "group", "batch"])
@pytest.mark.parametrize("max_tokens", [None, 28])
def test_streamed_rows_equal_built_samples(algo, pack, max_tokens):
    """Every algo, pack and budget: the streamed rows, written, are the built samples' bytes,
    and the summary counted on the way is the built batch's."""
    calls, outcomes = _corpus()
    forest = build_forest(calls)
    opts = dict(algo=algo, pack=pack, max_tokens=max_tokens)
    built = build_samples(forest, outcomes, **opts)
    batch, rows = stream_samples(forest, outcomes, **opts)
    tally = SampleTally()
    assert _text(tally.counted(rows)) == _text(built.samples) and built.samples
    assert batch.summary(tally) == built.summary() and batch.samples == []
    assert batch.excluded == built.excluded == {"s5": "status infra_error", "s8": "no outcome"}


def test_streamed_ppo_with_values_equal_built_samples():
    """PPO with the critic's values (matched to every sample before the first row)."""
    calls, outcomes = _corpus(1)
    forest = build_forest(calls)
    first = build_samples(forest, outcomes, algo="ppo", max_tokens=20, pack="group")
    rng = np.random.default_rng(0)
    values = {s["sample_id"]: rng.normal(size=len(s["input_ids"])) for s in first.samples}
    opts = dict(algo="ppo", max_tokens=20, pack="group", values=values, lam=0.9)
    built = build_samples(forest, outcomes, **opts)
    _, rows = stream_samples(forest, outcomes, **opts)
    assert _text(rows) == _text(built.samples)
    assert any(a != 0 for s in built.samples for a in s["advantages"])


@pytest.mark.parametrize("pack", ["session", "group"])
@pytest.mark.parametrize("weighting", ["token", "path"])
def test_streamed_sft_rows_equal_built_samples(pack, weighting):
    """SFT samples, written as made, are build_sft_samples' bytes."""
    calls, _ = _corpus(2)
    forest = build_forest(calls)
    opts = dict(pack=pack, weighting=weighting, max_tokens=20)
    built = build_sft_samples(forest, **opts)
    batch, rows = stream_sft_samples(forest, **opts)
    tally = SampleTally()
    assert _text(tally.counted(rows)) == _text(built.samples)
    assert batch.summary(tally) == built.summary()


@pytest.mark.parametrize(
    "args",
    [[], ["--pack", "group"], ["--pack", "batch", "--max-tokens", "20"], ["--algo", "ppo"]],
    ids=lambda a: " ".join(a) or "default",
)
def test_cli_writes_the_built_samples(tmp_path, args):
    """`claw-tree samples` (rows written as made) prints build_samples' samples, byte for byte,
    on a generated corpus and on the committed format examples."""
    calls, outcomes = _corpus(3)
    inputs = {
        "generated": (tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"),
        "examples": (
            FORMATS / "claw.call.v1.example.jsonl",
            FORMATS / "claw.outcome.v1.example.jsonl",
        ),
    }
    write_jsonl(calls, inputs["generated"][0])
    write_jsonl(outcomes, inputs["generated"][1])
    for cpath, opath in inputs.values():
        result = CliRunner().invoke(main, ["samples", str(cpath), str(opath), *args])
        assert result.exit_code == 0, result.output
        opts = {"algo": "ppo"} if "ppo" in args else {}
        if "--pack" in args:
            opts["pack"] = args[args.index("--pack") + 1]
        if "--max-tokens" in args:
            opts["max_tokens"] = 20
        built = build_samples(build_forest(cpath), opath, **opts)
        assert result.stdout == _text(built.samples) and built.samples


def test_records_hold_int32_token_ids(tmp_path):
    """Token ids are read as int32 (4 bytes a flat token); the forest's node arrays stay int64."""
    path = tmp_path / "calls.jsonl"
    write_jsonl(_corpus()[0], path)
    calls = read_calls(path).records
    assert {c.prompt_ids.dtype for c in calls} == {c.completion_ids.dtype for c in calls}
    assert calls[0].prompt_ids.dtype == np.int32
    forest = build_forest(calls)
    assert forest.tokens.dtype == np.int64 and forest.parent.dtype == np.int64
    assert json.loads(_text([{"ids": calls[0].prompt_ids}]))["ids"] == calls[0].prompt_ids.tolist()


def _large_corpus(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """30 sessions in 5 groups whose first sessions interleave (random names), 2 harnesses that
    cut across groups, one session without a trainable call, one not ok, one without an outcome,
    an outcome without calls, duplicate lines and some calls at temperature 0.7."""
    rng = random.Random(seed)
    calls, outcomes = [], []
    for s in range(30):
        name = f"r{rng.randrange(10**6):06d}-{s}"
        rows = random_session(rng, name, rng.randint(1, 8), alphabet=5)
        for row in rows:
            if s == 3:
                row["trainable"] = False
            if s % 5 == 2:
                row["sampling"] = {"temperature": 0.7}
        calls += rows + rows[:1]  # one duplicate line per session
        if s != 7:
            status = "not_scorable" if s == 11 else "ok"
            reward = float(rng.choice([0.0, 0.25, 1.0]))
            group = f"g{s % 5}"
            outcomes.append(outcome(name, reward, group=group, harness=f"h{s % 2}", status=status))
    outcomes.append(outcome("no-calls", 1.0, group="g0"))
    rng.shuffle(calls)
    return calls, outcomes


def _built_or_error(forest, outcomes, **opts):
    try:
        return build_samples(forest, outcomes, **opts), None
    except BudgetError as exc:
        return None, str(exc)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("pack", ["session", "group", "batch"])
@pytest.mark.parametrize("max_tokens", [None, 40, 22, 9])
@pytest.mark.parametrize("weighting", ["token", "rollout", "path"])
def test_file_samples_equal_built_samples(tmp_path, algo, pack, max_tokens, weighting):
    """Samples built one unit at a time from an indexed calls file (units of one session, group
    or bucket, the open sample carried over; and one unit) are build_samples' bytes, with the
    same summary, exclusions and BudgetError."""
    calls, outcomes = _large_corpus()
    path = tmp_path / "calls.jsonl"
    write_jsonl(calls, path)
    opts = dict(algo=algo, pack=pack, max_tokens=max_tokens, path_weighting=weighting)
    built, error = _built_or_error(build_forest(calls), outcomes, **opts)
    index = index_calls(path)
    for unit_tokens in (1, 60, 10**9):
        if error is not None:
            with pytest.raises(BudgetError) as caught:
                stream_indexed_samples(index, outcomes, unit_tokens=unit_tokens, **opts)
            assert str(caught.value) == error
            continue
        batch, rows = stream_indexed_samples(index, outcomes, unit_tokens=unit_tokens, **opts)
        tally = SampleTally()
        assert _text(tally.counted(rows)) == _text(built.samples), unit_tokens
        assert batch.summary(tally) == built.summary() and batch.excluded == built.excluded
    assert built is None or len(built.samples) > 1


def test_file_samples_read_a_shard_series_and_skip_invalid_lines(tmp_path):
    """A series (calls.jsonl, calls.00001.jsonl) is indexed in order; --skip-invalid lines are
    skipped and listed as read_calls does."""
    calls, outcomes = _large_corpus(1)
    path = tmp_path / "calls.jsonl"
    half = len(calls) // 2
    write_jsonl(calls[:half], path)
    write_jsonl(calls[half:], tmp_path / "calls.00001.jsonl")
    with path.open("a") as fh:
        fh.write("\n{not json\n")
    with pytest.raises(RecordError, match="not JSON"):
        index_calls(path)
    index = index_calls(path, skip_invalid=True)
    assert index.skipped == read_calls(path, skip_invalid=True).skipped and index.skipped
    built = build_samples(build_forest(calls), outcomes, pack="group", max_tokens=40)
    _, rows = stream_file_samples(
        path, outcomes, skip_invalid=True, pack="group", max_tokens=40, unit_tokens=1
    )
    assert _text(rows) == _text(built.samples)


def test_index_raises_the_first_conflict_in_file_order(tmp_path):
    """A call_id recorded twice with different content (same session, or another session) is
    build_forest's ConflictError, the first one in file order; exact duplicates are not."""
    calls, _ = _large_corpus(2)
    path = tmp_path / "calls.jsonl"
    write_jsonl(calls, path)
    index_calls(path)  # duplicates only
    late = dict(calls[-1], seq=calls[-1]["seq"] + 100)
    early = dict(calls[5], session="elsewhere")
    for bad in ([*calls, late], [*calls[:10], early, *calls[10:], late]):
        write_jsonl(bad, path)
        with pytest.raises(ConflictError) as expected:
            build_forest(bad)
        with pytest.raises(ConflictError) as caught:
            index_calls(path)
        assert str(caught.value) == str(expected.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--pack", "session", "--max-tokens", "40", "--path-weighting", "path"],
        ["--pack", "group", "--max-tokens", "40", "--algo", "rloo"],
        ["--pack", "batch", "--path-weighting", "rollout"],
    ],
    ids=lambda a: " ".join(a),
)
def test_cli_streams_the_built_samples(tmp_path, args):
    """`claw-tree samples FILE` (indexed, built unit by unit) prints build_samples' bytes and
    summary."""
    calls, outcomes = _large_corpus(3)
    cpath, opath = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    write_jsonl(calls, cpath)
    write_jsonl(outcomes, opath)
    result = CliRunner().invoke(main, ["samples", str(cpath), str(opath), *args])
    assert result.exit_code == 0, result.output
    opts: dict = {"pack": args[1]}
    for flag, field in (("--max-tokens", "max_tokens"), ("--algo", "algo")):
        if flag in args:
            opts[field] = args[args.index(flag) + 1]
    if "--path-weighting" in args:
        opts["path_weighting"] = args[args.index("--path-weighting") + 1]
    if "max_tokens" in opts:
        opts["max_tokens"] = int(opts["max_tokens"])
    built = build_samples(build_forest(calls), outcomes, **opts)
    assert result.stdout == _text(built.samples)
    assert built.summary() in result.stderr
