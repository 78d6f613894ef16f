"""MoE routing through the tree: calls' routing side stores read into one row per node, packed
into samples' own side store, against a per-path reference built from the calls alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from claw_tree import build_forest, build_samples, build_sft_samples, forest_stats, read_calls
from claw_tree._packing import as_lists
from claw_tree.cli import main
from claw_tree.corpus import stream_file_samples
from claw_tree.errors import ClawError, RecordError
from claw_tree.routing import read_sample_routing
from claw_tree.samples import token_sessions
from click.testing import CliRunner
from tree_testlib import call, outcome

L, K, E = 2, 2, 8
DENSE = Path(__file__).resolve().parent / "data" / "dense"


class Store:
    """A routing file written as the contract says (the proxy's side, not imported): the 8
    magic bytes, then each array's raw little-endian bytes, appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"CLAWRT1\n")
        self.rows: dict[str, np.ndarray] = {}  # call_id -> its rows

    def add(self, row: dict, rows: np.ndarray, *, start: int = 0, dtype: str = "uint8") -> dict:
        arr = np.asarray(rows, dtype="<u1" if dtype == "uint8" else "<i2")
        with self.path.open("ab") as fh:
            offset = fh.tell()
            fh.write(arr.tobytes())
        ref = {"file": self.path.name, "offset": offset, "shape": list(arr.shape)}
        ref |= {"dtype": dtype, "experts": E}
        if start:
            ref["start"] = start
        row["routing"] = ref
        self.rows[row["call_id"]] = np.asarray(rows, dtype=np.int16)
        return row


def _rows(rng: random.Random, n: int) -> np.ndarray:
    return np.array([rng.randrange(E) for _ in range(n * L * K)], dtype=np.int16).reshape(n, L, K)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _chain(tmp_path: Path, rng: random.Random, c2_start: int = 8) -> tuple[Store, list[dict]]:
    """Three calls of one session, each continuing the previous one; c1 and c2 reuse its ids
    (routing.start > 0: rows before start are the parent's), or c2 re-renders (start 0)."""
    store = Store(tmp_path / "calls.routing")
    c0 = call("s", 0, [1, 2, 3], [4, 5])
    c1 = call("s", 1, [1, 2, 3, 4, 5, 6, 7], [8, 9])
    c1["prefix"] = {"reused_tokens": 5, "parent_call": "s-c0"}
    c2 = call("s", 2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12])
    if c2_start:
        c2["prefix"] = {"reused_tokens": 9, "parent_call": "s-c1"}
    store.add(c0, _rows(rng, 4))
    store.add(c1, _rows(rng, 4), start=4)
    store.add(c2, _rows(rng, 12 - 1 - c2_start), start=c2_start)
    return store, [c0, c1, c2]


def test_node_rows_are_the_calls_rows_and_start_inherits_the_parents(tmp_path):
    """A chain of 3 calls: nodes 0-3 hold c0's rows, 4-7 c1's (its start 4: rows 0-3 are c0's),
    8-10 c2's; the last sampled token was never forwarded (-1); no forks."""
    store, rows = _chain(tmp_path, random.Random(0))
    forest = build_forest(_write(tmp_path / "calls.jsonl", rows))
    assert forest.routing is not None and forest.routing.shape == (12, L, K)
    want = np.concatenate(
        [store.rows["s-c0"], store.rows["s-c1"], store.rows["s-c2"], np.full((1, L, K), -1)]
    )
    np.testing.assert_array_equal(forest.routing, want)
    assert forest.routing.dtype == np.int16 and forest.routing_forks.sum() == 0
    stats = forest_stats(forest)
    assert stats["routing_forks"] == 0 and stats["routed_tokens"] == 11
    assert stats["routing"] == {"layers": L, "top_k": K, "experts": E}


def test_a_planted_disagreement_is_one_fork_and_keeps_the_generating_calls_row(tmp_path):
    """c2 re-renders the whole conversation (start 0) and records another row for token 7, which
    c1 generated: one fork, and the node keeps c1's row; every other row agrees."""
    rng = random.Random(1)
    store, rows = _chain(tmp_path, rng, c2_start=0)
    agreed = np.concatenate([store.rows["s-c0"], store.rows["s-c1"], _rows(rng, 3)])
    planted = agreed.copy()
    planted[7] = (planted[7] + 1) % E
    store.add(rows[2], planted)
    forest = build_forest(_write(tmp_path / "calls.jsonl", rows))
    np.testing.assert_array_equal(forest.routing[:11], agreed)
    assert forest.routing_forks.tolist() == [0] * 7 + [1] + [0] * 4
    assert forest_stats(forest)["routing_forks"] == 1


def test_the_generating_call_wins_over_an_earlier_forwarder(tmp_path):
    """Call a (seq 0) forwarded tokens that call b (seq 1) later generated, with other rows:
    the generated nodes keep b's rows (one fork each), the shared prompt a's."""
    rng = random.Random(2)
    store = Store(tmp_path / "calls.routing")
    a = store.add(call("s", 0, [1, 2, 3, 4, 5], []), _rows(rng, 4))
    b_rows = store.rows["s-c0"].copy()
    b_rows[2:] = (b_rows[2:] + 3) % E
    b = store.add(call("s", 1, [1, 2], [3, 4, 5]), b_rows)
    forest = build_forest(_write(tmp_path / "calls.jsonl", [b, a]))
    np.testing.assert_array_equal(forest.routing[:4], b_rows)
    assert forest.routing_forks.tolist() == [0, 0, 1, 1, 0]


def test_mixed_layer_shapes_name_both_calls(tmp_path):
    """Two calls with different (L, K, E) in one forest: an error naming both."""
    store = Store(tmp_path / "calls.routing")
    a = store.add(call("s", 0, [1, 2], [3]), np.zeros((2, L, K)))
    b = store.add(call("t", 0, [1, 2], [3]), np.zeros((2, L + 1, K)))
    with pytest.raises(RecordError, match="s-c0") as err:
        build_forest(_write(tmp_path / "calls.jsonl", [a, b]))
    assert "t-c0" in str(err.value) and "calls.jsonl:2" in str(err.value)


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda p, r: p.write_bytes(b"CLAWRT2\n" + p.read_bytes()[8:]), "routing.file"),
        (lambda p, r: p.write_bytes(p.read_bytes()[:-1]), "routing.offset"),
        (lambda p, r: p.write_bytes(p.read_bytes()[:-1] + bytes([E])), "routing"),
        (lambda p, r: p.unlink(), "routing.file"),
        (lambda p, r: r["routing"].update(shape=[3, L, K]), "routing.shape"),
        (lambda p, r: r["routing"].update(offset=4), "routing.offset"),
        (lambda p, r: r["routing"].update(file="../calls.routing"), "routing.file"),
        (lambda p, r: r["routing"].update(dtype="int32"), "routing.dtype"),
        (lambda p, r: r["routing"].update(start=1), "routing.start"),
        (lambda p, r: r["routing"].pop("experts"), "routing.experts"),
    ],
)
def test_bad_routing_names_file_line_and_field(tmp_path, damage, field):
    """A broken store or reference: a RecordError naming calls.jsonl:1 and the field."""
    store = Store(tmp_path / "calls.routing")
    row = store.add(call("s", 0, [1, 2], [3]), np.ones((2, L, K)))
    damage(store.path, row)
    with pytest.raises(RecordError) as err:
        build_forest(_write(tmp_path / "calls.jsonl", [row]))
    assert "calls.jsonl:1" in str(err.value) and f"{field}:" in str(err.value), str(err.value)


def test_shards_read_their_own_store_and_routing_dir_overrides(tmp_path):
    """calls.jsonl and calls.00001.jsonl each reference their own .routing by bare name; a
    reader elsewhere (stdin: the working directory) is pointed at them with routing_dir."""
    rng = random.Random(3)
    first, second = Store(tmp_path / "calls.routing"), Store(tmp_path / "calls.00001.routing")
    a = first.add(call("s", 0, [1, 2, 3], [4]), _rows(rng, 3))
    b = second.add(call("s", 1, [1, 2, 3, 4, 5], [6]), _rows(rng, 5))
    _write(tmp_path / "calls.jsonl", [a])
    _write(tmp_path / "calls.00001.jsonl", [b])
    forest = build_forest(tmp_path / "calls.jsonl")
    np.testing.assert_array_equal(forest.routing[:3], first.rows["s-c0"])
    np.testing.assert_array_equal(forest.routing[3:5], second.rows["s-c1"][3:])
    assert forest.routing_forks.sum() == int(
        np.any(first.rows["s-c0"] != second.rows["s-c1"][:3], axis=(1, 2)).sum()
    )
    moved = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    with pytest.raises(RecordError, match="routing.file"):
        build_forest(read_calls(moved).records)  # resolved against the working directory
    again = build_forest(read_calls(moved, routing_dir=tmp_path).records)
    np.testing.assert_array_equal(again.routing[:3], first.rows["s-c0"])


# --- samples against a per-path reference ---------------------------------------------------


def _context_row(j: int, token: int) -> np.ndarray:
    """A prompt token's row: the same in every call (so merged context agrees)."""
    return ((np.arange(L * K).reshape(L, K) * 3 + j * 5 + token * 7) % E).astype(np.int16)


def _corpus(tmp_path: Path, seed: int) -> tuple[Store, list[dict], list[dict]]:
    """Sessions sharing a system prompt, each call continuing an earlier one (reusing its ids:
    start > 0) or re-rendering it (start 0, where a completion token gets another row: a fork);
    prompt tokens' rows depend on the token and position only, completion tokens' are random."""
    rng = random.Random(seed)
    store = Store(tmp_path / "calls.routing")
    calls, outcomes = [], []
    for s in range(6):
        name, seqs = f"s{s}", []
        for k in range(rng.randint(1, 4)):
            prefix, start, base = None, 0, [9, 9, 1, 2]
            if seqs and rng.random() < 0.8:
                parent, base = rng.choice(seqs)
                if rng.random() < 0.5:
                    prefix = {"reused_tokens": len(base), "parent_call": parent}
                    start = len(base) - 1
            prompt = base + [rng.randrange(4) for _ in range(rng.randint(1, 3))]
            completion = [rng.randrange(4) for _ in range(rng.randint(1, 4))]
            seq = prompt + completion
            rows = np.stack(
                [
                    _context_row(j, seq[j]) if j < len(prompt) else _rows(rng, 1)[0]
                    for j in range(start, len(seq) - 1)
                ]
            )
            row = call(name, k, prompt, completion, prefix=prefix)
            calls.append(store.add(row, rows, start=start))
            seqs.append((row["call_id"], seq))
        group = f"g{s % 2}"
        outcomes.append(outcome(name, float(rng.choice([0.0, 1.0])), group=group, harness="h"))
    rng.shuffle(calls)
    return store, calls, outcomes


def _reference(store: Store, calls: list[dict], session: str, prefix: tuple) -> tuple:
    """(row, forks) of the node ``prefix`` from the session's calls alone: the generating call's
    recorded row, else the first (seq, call_id) forwarder's; forks: recorded rows that differ."""
    j = len(prefix) - 1
    found = []
    for c in sorted(calls, key=lambda c: (c["seq"], c["call_id"])):
        seq = c["prompt_ids"] + c["completion_ids"]
        start = c["routing"].get("start", 0)
        if c["session"] == session and tuple(seq[: j + 1]) == prefix and start <= j < len(seq) - 1:
            found.append((j >= len(c["prompt_ids"]), store.rows[c["call_id"]][j - start]))
    if not found:
        return np.full((L, K), -1), 0
    kept = ([r for g, r in found if g] or [found[0][1]])[0]
    return kept, sum(int(np.any(r != kept)) for _, r in found)


def _check_samples(store, calls, samples, base_dir):
    """Every sample's stored rows equal the per-path reference; its routing_forks tag the sum
    of the reference's forks over its tokens."""
    for sample in samples:
        rows = read_sample_routing(sample, base_dir)
        assert (
            rows.shape == (len(sample["input_ids"]), L, K) and sample["routing"]["dtype"] == "int16"
        )
        owner = token_sessions(sample)
        prefixes: list[tuple] = []
        forks = 0
        for i, (tok, par) in enumerate(zip(sample["input_ids"], sample["parent"], strict=True)):
            prefixes.append((prefixes[par] if par >= 0 else ()) + (tok,))
            want, n = _reference(store, calls, sample["sessions"][owner[i]], prefixes[i])
            np.testing.assert_array_equal(rows[i], want)
            forks += n
        assert sample["tags"]["routing_forks"] == forks


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("pack", "split"), [("session", False), ("session", True), ("group", False), ("batch", True)]
)
def test_samples_carry_the_per_path_reference_rows(tmp_path, seed, pack, split):
    """Session, group and batch packing, with and without --max-tokens splits (RL and SFT):
    each sample's rows, read back from its side store, are the per-path reference's."""
    store, calls, outcomes = _corpus(tmp_path, seed)
    forest = build_forest(_write(tmp_path / "calls.jsonl", calls))
    assert forest.routing_forks.sum() > 0  # re-rendered completions disagree
    longest = max(t.length for t in forest.trajectories)
    max_tokens = longest if split else None  # a budget of the longest path splits sessions
    out = tmp_path / "rl.routing"
    batch = build_samples(forest, outcomes, pack=pack, max_tokens=max_tokens, routing_out=out)
    assert batch.samples and all(s["routing"]["file"] == str(out) for s in batch.samples)
    _check_samples(store, calls, batch.samples, None)
    sft = build_sft_samples(
        forest,
        pack="group" if pack == "batch" else pack,
        max_tokens=max_tokens,
        routing_out=tmp_path / "sft.routing",
    )
    _check_samples(store, calls, sft.samples, None)


def test_a_merged_token_keeps_the_first_rollouts_row_and_counts_a_fork(tmp_path):
    """Two rollouts of a group share a system prompt whose token 1 the second recorded with
    another row: the merged token keeps the first's row, and the sample counts one fork."""
    store = Store(tmp_path / "calls.routing")
    first = np.stack([_context_row(j, t) for j, t in enumerate([5, 6, 7])])
    other = first.copy()
    other[1] = (other[1] + 1) % E
    a = store.add(call("a", 0, [5, 6, 7], [1]), first)
    b = store.add(call("b", 0, [5, 6, 7], [2]), other)
    forest = build_forest(_write(tmp_path / "calls.jsonl", [a, b]))
    outs = [outcome("a", 1.0, group="g"), outcome("b", 0.0, group="g")]
    (sample,) = build_samples(
        forest, outs, pack="group", routing_out=tmp_path / "s.routing"
    ).samples
    rows = read_sample_routing(sample)
    assert sample["input_ids"] == [5, 6, 7, 1, 2] and sample["tags"]["routing_forks"] == 1
    np.testing.assert_array_equal(rows[:3], first)
    assert (rows[3:] == -1).all()  # the last sampled tokens were never forwarded


def test_cli_writes_the_store_next_to_the_samples_and_round_trips(tmp_path):
    """`samples -o out.jsonl` (streamed from the file) writes out.routing, referenced by its
    bare name, with the library's rows; stdout needs --routing-out; --no-routing drops it."""
    store, calls, outcomes = _corpus(tmp_path, 1)
    calls_path = _write(tmp_path / "calls.jsonl", calls)
    outs = _write(tmp_path / "outcomes.jsonl", outcomes)
    runner = CliRunner()
    res = runner.invoke(
        main,
        [
            "samples",
            str(calls_path),
            str(outs),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--pack",
            "group",
        ],
    )
    assert res.exit_code == 0, res.output
    samples = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert (tmp_path / "out.routing").read_bytes()[:8] == b"CLAWRT1\n"
    assert {s["routing"]["file"] for s in samples} == {"out.routing"}
    _check_samples(store, calls, samples, tmp_path)
    built = build_samples(build_forest(calls_path), outcomes, pack="group", routing_out=False)
    assert [{k: v for k, v in s.items() if k != "routing"} for s in samples] == [
        {**s, "tags": {**s["tags"], "routing_forks": t["tags"]["routing_forks"]}}
        for s, t in zip(built.samples, samples, strict=True)
    ]
    res = runner.invoke(
        main,
        ["samples", "-", str(outs), "--routing-dir", str(tmp_path)],
        input=calls_path.read_text(),
    )
    assert res.exit_code != 0 and "--routing-out" in res.output
    res = runner.invoke(
        main, ["sft-samples", str(calls_path), "--no-routing", "-o", str(tmp_path / "plain.jsonl")]
    )
    assert res.exit_code == 0 and not (tmp_path / "plain.routing").exists()
    assert "routing" not in (tmp_path / "plain.jsonl").read_text()
    stats = json.loads(runner.invoke(main, ["stats", "--json", str(calls_path)]).output)
    assert stats["routing_forks"] == int(build_forest(calls_path).routing_forks.sum()) > 0


def test_routed_calls_without_routing_out_is_a_clear_error(tmp_path):
    """build_samples on routed calls needs routing_out (a path) or routing_out=False."""
    _, calls, outcomes = _corpus(tmp_path, 0)
    forest = build_forest(_write(tmp_path / "calls.jsonl", calls))
    with pytest.raises(ClawError, match="routing_out=False"):
        build_samples(forest, outcomes)
    assert "routing" not in build_samples(forest, outcomes, routing_out=False).samples[0]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("grpo_session.jsonl", []),
        ("grpo_group_28.jsonl", ["--pack", "group", "--max-tokens", "28"]),
        ("rloo_batch_28.jsonl", ["--pack", "batch", "--max-tokens", "28", "--algo", "rloo"]),
        ("ppo_session.jsonl", ["--algo", "ppo"]),
        ("sft_session.jsonl", None),
        ("sft_group_28.jsonl", ["--pack", "group", "--max-tokens", "28"]),
    ],
)
def test_a_run_without_routing_is_byte_identical_to_before(tmp_path, name, args):
    """The dense corpus's samples equal, byte for byte, what the code before routing wrote
    (tests/data/dense), with no side store written and no routing array allocated."""
    out = tmp_path / name
    if name.startswith("sft"):
        cmd = ["sft-samples", str(DENSE / "calls.jsonl"), *(args or []), "-o", str(out)]
    else:
        cmd = ["samples", str(DENSE / "calls.jsonl"), str(DENSE / "outcomes.jsonl"), *args]
        cmd += ["-o", str(out)]
    res = CliRunner().invoke(main, cmd)
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == (DENSE / name).read_bytes()
    assert list(tmp_path.iterdir()) == [out]
    forest = build_forest(DENSE / "calls.jsonl")
    assert forest.routing is None and forest.routing_forks is None
    stats = CliRunner().invoke(main, ["stats", "--json", str(DENSE / "calls.jsonl")]).output
    assert stats == (DENSE / "stats.json").read_text()


@pytest.mark.parametrize(("pack", "max_tokens"), [("session", 30), ("batch", 30), ("group", None)])
def test_streamed_samples_carry_the_built_samples_rows(tmp_path, pack, max_tokens):
    """Streamed from the file one session a unit (an open sample built again with the next
    unit), the samples and their rows equal those built from the whole forest."""
    _, calls, outcomes = _corpus(tmp_path, 0)
    path = _write(tmp_path / "calls.jsonl", calls)
    opts = {"pack": pack, "max_tokens": max_tokens}
    built = build_samples(build_forest(path), outcomes, routing_out=tmp_path / "a.routing", **opts)
    _, rows = stream_file_samples(
        path, outcomes, unit_tokens=1, routing_out=tmp_path / "b.routing", **opts
    )
    streamed = list(rows)
    assert len(streamed) == len(built.samples) > 1
    for a, b in zip(built.samples, streamed, strict=True):
        assert {**a, "routing": None} == {**as_lists(b), "routing": None}
        np.testing.assert_array_equal(read_sample_routing(a), read_sample_routing(b))
