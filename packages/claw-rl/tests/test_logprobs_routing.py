"""`claw-rl logprobs` on an MoE policy's calls: the calls' recorded routing (docs/formats.md,
Routing store) and kept sets go to the learner.

The "engine" is the tiny MoE (tests/fixtures/tiny-qwen3-moe) cast to bf16: a plain forward's
top-k per token and layer is what it records (written here as the contract says: claw-proxy is
not imported), so some (token, layer) rows differ from the fp32 learner's live choice. Three
calls: c0; c1 continuing c0 (``routing.start`` 99: its first 99 rows are c0's); c2 whose parent
is not in the file (its rows before ``start`` are the learner's to choose).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner
from claw_rl._moe import flip_rate, route
from claw_rl.calls import call_to_sample, read_call_samples
from claw_rl.cli import main
from claw_rl.errors import RecordError
from claw_rl.packing import chain_sample
from claw_rl.records import Routing
from click.testing import CliRunner

MOE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3-moe"
L, K, E = 2, 2, 8


@pytest.fixture(scope="module")
def engine():
    """The fp32 policy and its bf16 copy (the engine)."""
    policy = Learner.grpo(GRPOConfig(), MOE).policy
    return policy, copy.deepcopy(policy).to(torch.bfloat16)


def _forward(model, tokens: list[int]) -> tuple[np.ndarray, torch.Tensor]:
    """(experts (N, L, K) int16 of a plain forward, log_softmax (N, V) float32)."""
    with torch.no_grad(), route(model, capture=True) as state:
        logits = model(torch.tensor([tokens])).logits[0]
    assert state.captured is not None
    return state.captured[0].numpy().astype(np.int16), torch.log_softmax(logits.float(), -1)


class Store:
    """A calls routing file: the magic, then each call's rows appended (uint8)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"CLAWRT1\n")

    def add(self, rows: np.ndarray, start: int = 0, experts: int = E) -> dict:
        with self.path.open("ab") as fh:
            offset = fh.tell()
            fh.write(np.ascontiguousarray(rows, dtype="<u1").tobytes())
        ref = {"file": self.path.name, "offset": offset, "shape": list(rows.shape)}
        return {**ref, "dtype": "uint8", "experts": experts, **({"start": start} if start else {})}


def _call(bf16, cid: str, prompt: list[int], completion: list[int], store: Store, *,
          start: int = 0, parent: str | None = None, **extra) -> tuple[dict, np.ndarray]:  # fmt: skip
    """A claw.call/v1 line recorded by the bf16 engine; its full forward's rows (N - 1, L, K)."""
    tokens = prompt + completion
    rows, logp = _forward(bf16, tokens[:-1])
    n_p = len(prompt)
    lp = []
    for j, t in enumerate(completion):
        z = logp[n_p - 1 + j]
        if "completion_kept" in extra:  # the target and the kept[j] largest other tokens
            others = z.clone()
            others[t] = float("-inf")
            kept = torch.cat([z[t : t + 1], others.topk(extra["completion_kept"][j]).values])
            lp.append(float(z[t] - torch.logsumexp(kept, 0)))
        else:
            lp.append(float(z[t]))
    row = {"schema": "claw.call/v1", "call_id": cid, "session": "s", "seq": 0, "trainable": True,
           "prompt_ids": prompt, "completion_ids": completion, "completion_logprobs": lp,
           "prefix": {"reused_tokens": start, "parent_call": parent},
           "routing": store.add(rows[start:], start), **extra}  # fmt: skip
    return row, rows


def _recorded(tmp_path: Path, bf16) -> tuple[Path, list[dict], list[np.ndarray]]:
    """The calls file and, per call, the rows (N, L, K) the learner must replay."""
    rng = np.random.default_rng(3)
    toks = lambda n: rng.integers(3, 2000, n).tolist()  # noqa: E731
    store = Store(tmp_path / "calls.routing")
    c0, r0 = _call(bf16, "c0", toks(60), toks(40), store, sampling={"top_k": 20},
                   completion_kept=[19] * 40)  # fmt: skip
    c1, r1 = _call(bf16, "c1", c0["prompt_ids"] + c0["completion_ids"] + toks(20), toks(40),
                   store, start=99, parent="c0")  # fmt: skip
    c2, r2 = _call(bf16, "c2", toks(80), toks(30), store, start=50, parent="gone")
    want = []
    for row, rows, start, prefix in ((c0, r0, 0, None), (c1, r1, 99, r0[:99]),
                                     (c2, r2, 50, None)):  # fmt: skip
        n = len(row["prompt_ids"]) + len(row["completion_ids"])
        w = np.full((n, L, K), -1, dtype=np.int16)
        w[start : n - 1] = rows[start:]
        if prefix is not None:
            w[:start] = prefix
        want.append(w)
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in (c0, c1, c2)))
    return path, [c0, c1, c2], want


def _expected(calls: list[dict], want: list[np.ndarray], replay: bool) -> list:
    """The calls' samples built here: kept from completion_kept, routing the rows above."""
    out = []
    for row, rows in zip(calls, want, strict=True):
        p, c = row["prompt_ids"], row["completion_ids"]
        kept = row.get("completion_kept")
        top_k = row.get("sampling", {}).get("top_k", 0)
        routing = Routing(file="", path=None, offset=0, shape=rows.shape, dtype="int16",
                          experts=E, array=rows)  # fmt: skip
        out.append(chain_sample(row["call_id"], p, c, row["completion_logprobs"],
                                top_ks=(0,) * len(p) + (top_k,) * len(c),
                                kept=None if kept is None else (-1,) * len(p) + tuple(kept),
                                routing=routing if replay else None))  # fmt: skip
    return out


def _cli(calls: Path, *args: str) -> tuple[list[dict], dict, str]:
    res = CliRunner().invoke(main, ["logprobs", "--model", str(MOE), "--calls", str(calls), *args])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    return lines, json.loads(res.stderr.strip().splitlines()[-1]), res.stderr


def test_logprobs_replays_the_calls_recorded_routing(tmp_path, engine):
    """r3 (the default): each call's logprobs are bit for bit those of a forward with its
    recorded experts replayed (c1's first 99 rows c0's, c2's first 50 live), with the engine's
    kept sets; the flip rate of the learner's live top-k against the bf16 engine's is reported.
    With --routing-replay off the learner routes live: other logprobs, and the flips are those
    of a plain fp32 forward against the recorded rows."""
    policy, bf16 = engine
    path, calls, want = _recorded(tmp_path, bf16)
    out, summary, err = _cli(path)
    replayed = Learner.grpo(GRPOConfig(routing_replay="r3"), MOE).logprobs(
        _expected(calls, want, replay=True)
    )
    for line, row, lp in zip(out, calls, replayed, strict=True):
        assert line["logprobs"] == lp[len(row["prompt_ids"]) :], line["call_id"]
    recorded = sum(int((w[:, 0, 0] >= 0).sum()) for w in want)
    assert summary["routing_recorded_fraction"] == recorded / sum(len(w) for w in want)
    assert 0 < summary["routing_flip_rate"] < 0.1
    assert summary["routing_missing_parents"] == 1 and summary["routing_unrouted_tokens"] == 50
    assert "1 calls reuse a prefix" in err and "50 tokens" in err

    live_out, live_summary, _ = _cli(path, "--routing-replay", "off")
    live = Learner.grpo(GRPOConfig(), MOE).logprobs(_expected(calls, want, replay=False))
    for line, row, lp in zip(live_out, calls, live, strict=True):
        assert line["logprobs"] == lp[len(row["prompt_ids"]) :], line["call_id"]
    assert any(a["logprobs"] != b["logprobs"] for a, b in zip(out, live_out, strict=True))
    flipped = compared = 0
    for row, w in zip(calls, want, strict=True):
        rows, _ = _forward(policy, row["prompt_ids"] + row["completion_ids"])
        f, n = flip_rate(torch.from_numpy(rows), torch.from_numpy(w))
        flipped, compared = flipped + f, compared + n
    assert flipped > 0 and live_summary["routing_flip_rate"] == flipped / compared
    assert summary["mismatch_mean_abs"] < live_summary["mismatch_mean_abs"]


def test_call_to_sample_carries_kept_and_resolved_routing(tmp_path, engine):
    """completion_kept -> kept (-1 on the prompt); routing -> the sample's rows in memory (only
    with the file's calls to resolve a reused prefix); a call alone validates its reference."""
    path, calls, want = _recorded(tmp_path, engine[1])
    read = read_call_samples(path)
    s0, s1, s2 = (s for _, s in read.pairs)
    assert s0.kept == (-1,) * 60 + (19,) * 40 and s1.kept is None
    for s, w in zip((s0, s1, s2), want, strict=True):
        assert s.routing is not None and np.array_equal(s.routing.load(), w)
    assert (read.missing_parents, read.unrouted_tokens) == (1, 50)
    alone = call_to_sample(calls[1], "calls.jsonl:2")
    assert alone is not None and alone.routing is None and alone.kept is None


def _damaged(tmp_path: Path, engine, damage) -> str:
    path, calls, _ = _recorded(tmp_path, engine[1])
    damage(calls)
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    res = CliRunner().invoke(main, ["logprobs", "--model", str(MOE), "--calls", str(path)])
    assert res.exit_code != 0
    return res.output


def test_bad_call_routing_names_file_line_and_field(tmp_path, engine):
    """Routing of another model, a parent whose tokens are not the reused prefix, and a -1 row
    in a call are refused naming the call's line and field."""
    store = Store(tmp_path / "calls.routing")

    def other_model(calls):
        n = len(calls[2]["prompt_ids"]) + len(calls[2]["completion_ids"]) - 1 - 50
        calls[2]["routing"] = store.add(np.zeros((n, 3, K)), 50)

    out = _damaged(tmp_path, engine, other_model)
    assert "calls.jsonl:3" in out and "'routing': 3 MoE layers" in out

    def other_parent(calls):
        calls[1]["prompt_ids"][0] += 1

    out = _damaged(tmp_path, engine, other_parent)
    assert "calls.jsonl:2" in out and "prefix.parent_call" in out

    def unset(calls):
        rows = np.zeros((99, L, K), dtype=np.int16)
        rows[5] = -1
        with store.path.open("ab") as fh:
            offset = fh.tell()
            fh.write(rows.astype("<i2").tobytes())
        calls[0]["routing"] = {"file": store.path.name, "offset": offset, "shape": [99, L, K],
                               "dtype": "int16", "experts": E}  # fmt: skip

    out = _damaged(tmp_path, engine, unset)
    assert "calls.jsonl:1" in out and "token 5" in out and "-1" in out
    with pytest.raises(RecordError, match="routing.start"):
        call_to_sample({**_bare_call(), "routing": {"file": "r", "offset": 8, "shape": [2, L, K],
                        "dtype": "uint8", "experts": E, "start": 1}}, "c:1")  # fmt: skip


def _bare_call() -> dict:
    return {"schema": "claw.call/v1", "call_id": "x", "prompt_ids": [5, 6], "completion_ids": [7, 8],
            "completion_logprobs": [-1.0, -1.0]}  # fmt: skip
