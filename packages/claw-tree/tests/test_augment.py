"""Copied-number swaps on SFT samples (claw_tree.swap_copied_numbers)."""

import random

import pytest
from claw_tree import ClawError, build_forest, build_sft_samples, swap_copied_numbers
from tree_testlib import call

DIGITS = list(range(100, 110))  # token id of "0".."9"
READ, WRITE, RESULT, DONE, SEP = 50, 51, 52, 53, 54


def num(s):
    return [DIGITS[int(c)] for c in s]


def text(ids):
    """The sample's ids with digit runs shown as strings, other ids as they are."""
    out, run = [], ""
    for t in ids:
        if t in DIGITS:
            run += str(DIGITS.index(t))
            continue
        if run:
            out.append(run)
            run = ""
        out.append(t)
    return out + ([run] if run else [])


def session(sid, answer, decoy, system=(1, 2, 3)):
    """A read-then-write session: the tool result holds `answer`, the write call copies it; the
    instruction holds a number (`decoy`) the policy never writes."""
    p0 = [*system, SEP, *num(decoy), SEP]
    c0 = [READ, 2]
    p1 = [*p0, *c0, RESULT, *num("1"), SEP, *num(answer), SEP]
    c1 = [WRITE, *num(answer), 2]
    p2 = [*p1, *c1, RESULT]
    c2 = [DONE, *num("1"), 2]  # a generated "1" that is also in context: too short to swap
    return [call(sid, 0, p0, c0), call(sid, 1, p1, c1), call(sid, 2, p2, c2)]


def test_a_copied_number_becomes_one_fresh_number_everywhere():
    """The tool result's number and the write call's are the same fresh digits; the number only
    in context, the one-digit line number and every other token stay; the tree is untouched."""
    forest = build_forest(session("a", "422", "318"))
    (s,) = build_sft_samples(forest).samples
    out, n = swap_copied_numbers(s, DIGITS, random.Random(0))
    assert n == 1 and out["tags"]["numbers_swapped"] == 1
    before, after = text(s["input_ids"]), text(out["input_ids"])
    changed = {(b, a) for b, a in zip(before, after, strict=True) if b != a}
    assert len(changed) == 1
    ((old, new),) = changed
    assert old == "422" and len(new) == 3 and new[0] != "0" and new not in {"422", "318", "1"}
    assert before.count("422") == after.count(new) == 2  # tool result + write call
    for key in ("parent", "position_ids", "trainable", "loss_weights", "logprobs"):
        assert out[key] == s[key]
    assert s["input_ids"] != out["input_ids"] and "numbers_swapped" not in s["tags"]


def test_group_packed_sessions_each_get_their_own_number_and_avoid_is_kept():
    """Four sessions in one group-packed sample: each copied answer gets a distinct fresh number,
    none of them in `avoid`, none equal to a number already in the sample."""
    answers = ["422", "731", "905", "128"]
    calls = [c for k, a in enumerate(answers) for c in session("abcd"[k], a, "318")]
    (s,) = build_sft_samples(build_forest(calls), pack="group").samples
    avoid = {f"{k}" for k in range(100, 990)}  # leaves 990-999 and 4 already taken below 990
    seen = set()
    for seed in range(20):
        out, n = swap_copied_numbers(s, DIGITS, random.Random(seed), avoid=avoid)
        new = {t for t in text(out["input_ids"]) if isinstance(t, str)} - {"1", "318"}
        assert n == 4 and len(new) == 4 and all(990 <= int(x) <= 999 for x in new)
        seen |= new
    assert len(seen) > 4  # each draw is fresh


def test_a_number_never_copied_is_left_alone():
    """Generated digits that no context holds (and context digits never generated) stay."""
    calls = [call("a", 0, [1, *num("555"), SEP], [WRITE, *num("777"), 2])]
    (s,) = build_sft_samples(build_forest(calls)).samples
    out, n = swap_copied_numbers(s, DIGITS, random.Random(0))
    assert n == 0 and out["input_ids"] == s["input_ids"]


def test_a_run_that_branches_in_the_tree_is_left_alone():
    """Two continuations after one shared digit ("42" + "2" / "42" + "7"): no single fresh
    number fits both, so neither is swapped; an unbranched copy in the same sample still is."""
    p = [9, SEP, *num("422"), SEP]  # another system prompt: no context shared with "a"
    calls = [
        call("a", 0, [1, SEP, *num("42")], [*num("2"), SEP, *num("42"), 2]),
        call("a", 1, [1, SEP, *num("42")], [*num("7"), 2]),
        call("b", 0, p, [*num("422"), 2]),
    ]
    (s,) = build_sft_samples(build_forest(calls), pack="group").samples
    out, n = swap_copied_numbers(s, DIGITS, random.Random(0))
    assert n == 1
    assert text(out["input_ids"]).count("422") == text(s["input_ids"]).count("422") - 2


def test_bad_input_is_refused_with_the_field_named():
    (s,) = build_sft_samples(build_forest(session("a", "422", "318"))).samples
    with pytest.raises(ClawError, match="digit_ids must be the 10 distinct ids"):
        swap_copied_numbers(s, DIGITS[:9], random.Random(0))
    with pytest.raises(ClawError, match="has no 'parent'"):
        swap_copied_numbers({k: v for k, v in s.items() if k != "parent"}, DIGITS, random.Random(0))
    with pytest.raises(ClawError, match="differ in length"):
        swap_copied_numbers({**s, "parent": s["parent"][:-1]}, DIGITS, random.Random(0))
