"""examples/copy_stage.py: the curriculum's parsing, the probe's verdicts against models whose
answers are known, and the stage's cumulative harness pools."""

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
try:
    import copy_stage
finally:
    sys.path.remove(str(EXAMPLES))

DIGITS = list(range(10))  # token k is the digit k; 10.. are words
WORDS = {"read": 10, "file": 11, "result": 12, "write": 13, "done": 14, "line": 15}


def _call(call_id, prompt, completion, harness="h1"):
    return SimpleNamespace(
        call_id=call_id, prompt_ids=prompt, completion_ids=completion, tags={"harness": harness}
    )


def test_curriculum_is_harness_steps_pairs_of_run_harnesses():
    assert copy_stage.parse_curriculum("a:3, b:10", ["a", "b"]) == [("a", 3), ("b", 10)]
    for bad, why in [
        ("a", "is not HARNESS:STEPS"),
        ("a:0", "is not HARNESS:STEPS"),
        ("a:x", "is not HARNESS:STEPS"),
        ("c:3", "'c' is not a run harness"),
        ("a:3,a:4", "'a' is named twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            copy_stage.parse_curriculum(bad, ["a", "b"])


def test_probe_calls_are_the_calls_that_write_a_number_their_prompt_holds():
    w = WORDS
    copies = _call("c1", [w["read"], w["result"], 7, 1, 6], [w["write"], 7, 1, 6])
    guesses = _call("c2", [w["read"], w["result"], 7, 1, 6], [w["write"], 2, 9, 3])
    reads = _call("c3", [w["read"]], [w["file"], 4, 2])  # writes a number nobody showed it
    short = _call("c4", [w["result"], 5], [w["write"], 5])  # one digit: a count, not a copy
    got = copy_stage.probe_calls([copies, guesses, reads, short], DIGITS)
    assert [c["sample_id"] for c in got] == ["c1"]
    (c,) = got
    assert c["trainable"] == [False] * 5 + [True] * 4 and c["parent"][:2] == [-1, 0]
    assert c["tags"] == {"harness": "h1"}


class _Oracle(torch.nn.Module):
    """With `copy`, an induction head: after `write` it predicts the digits that follow
    `result`, one by one; without, it always predicts the digit `fixed` (a remembered answer)."""

    def __init__(self, copy: bool, fixed: int = 3):
        super().__init__()
        self.copy, self.fixed = copy, fixed

    def forward(self, ids):
        seq = ids[0].tolist()
        start = seq.index(WORDS["result"]) + 1
        end = next(i for i in range(start, len(seq)) if seq[i] not in DIGITS)
        number = seq[start:end]
        logits = torch.zeros(1, len(seq), 16)
        for i in range(len(seq)):
            k = i - seq.index(WORDS["write"]) if WORDS["write"] in seq else -1
            nxt = number[k] if self.copy and 0 <= k < len(number) else self.fixed
            logits[0, i, nxt] = 1.0
        return SimpleNamespace(logits=logits)


def test_probe_counts_a_copy_only_when_every_digit_of_the_fresh_number_is_written():
    w = WORDS
    calls = copy_stage.probe_calls(
        [
            _call(f"c{k}", [w["read"], w["result"], 7, 1, 6, w["line"]], [w["write"], 7, 1, 6], h)
            for k, h in enumerate(["h1", "h1", "h2"])
        ],
        DIGITS,
    )
    copier = copy_stage.probe(_Oracle(copy=True), calls, DIGITS, random.Random(0), avoid={"716"})
    assert copier == {"h1": [2, 2], "h2": [1, 1]}
    # a model that writes one remembered digit string never copies a fresh number
    guesser = copy_stage.probe(_Oracle(copy=False), calls, DIGITS, random.Random(0))
    assert guesser == {"h1": [0, 2], "h2": [0, 1]}


def _session(harness, number=(7, 1, 6)):
    """A one-session SFT sample (linear) that reads `number` and writes it."""
    w = WORDS
    ids = [w["read"], w["result"], *number, w["write"], *number, w["done"]]
    trainable = [False] * (2 + len(number)) + [True] * (len(number) + 2)
    return {
        "sample_id": harness, "algo": "sft", "input_ids": ids,
        "parent": list(range(-1, len(ids) - 1)), "trainable": trainable,
        "tags": {"harnesses": [harness]},
    }  # fmt: skip


def test_copy_sessions_keep_only_sessions_that_copy():
    slipped = _session("a")
    slipped["trainable"] = [False] * 5 + [False] * 3 + [True] * 2  # read, never wrote
    got = copy_stage.copy_sessions([_session("a"), _session("b"), slipped], DIGITS)
    assert {h: len(v) for h, v in got.items()} == {"a": 1, "b": 1}


def test_the_stage_pools_harnesses_cumulatively_and_swaps_every_step():
    class Learner:
        def __init__(self):
            self.batches = []

        def step(self, samples):
            self.batches.append(samples)
            return {"loss": 1.0 / len(self.batches)}

    learner = Learner()
    sessions = {"a": [_session("a")], "b": [_session("b")]}
    probes = []
    log = copy_stage.train(
        learner, sessions, [("a", 4), ("b", 30)], batch=3, digit_ids=DIGITS,
        rng=random.Random(1), avoid={"716"}, every=10,
        on_probe=lambda step, stage: probes.append((step, stage)) or {"copied": {}},
    )  # fmt: skip
    assert len(learner.batches) == 34 and all(len(b) == 3 for b in learner.batches)
    first = {s["tags"]["harnesses"][0] for b in learner.batches[:4] for s in b}
    later = {s["tags"]["harnesses"][0] for b in learner.batches[4:] for s in b}
    assert first == {"a"} and later == {"a", "b"}  # stage 2 keeps stage 1's harness
    numbers = {tuple(s["input_ids"][2:5]) for b in learner.batches for s in b}
    assert (7, 1, 6) not in numbers and len(numbers) > 20  # fresh, never the avoided answer
    for b in learner.batches:
        for s in b:  # the read and the written number stay the same after the swap
            assert s["input_ids"][2:5] == s["input_ids"][6:9]
    assert probes == [(4, "a"), (10, "b"), (20, "b"), (30, "b"), (34, "b")]
    assert [r["step"] for r in log] == [4, 10, 20, 30, 34] and log[0]["stage"] == "a"


def test_a_harness_without_copying_sessions_is_a_clear_error():
    with pytest.raises(ValueError, match="no b session that copies"):
        copy_stage.train(
            SimpleNamespace(step=lambda s: {"loss": 0.0}), {"a": [_session("a")]},
            [("a", 1), ("b", 1)], batch=1, digit_ids=DIGITS, rng=random.Random(0),
        )  # fmt: skip
