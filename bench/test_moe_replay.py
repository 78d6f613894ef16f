"""MoE routing replay (R3, issue 40) under a real numeric difference: a bf16 engine, an fp32 learner.

Run: .venvs/workspace/bin/python -m pytest bench/test_moe_replay.py -s -p no:cacheprovider
(~25 s on 2 CPU cores; the table goes to stdout and to pytest-benchmark's extra_info.)

The tiny Qwen3-MoE fixture (tests/fixtures/tiny-qwen3-moe: 2 MoE layers, 8 experts, top-2) is
served by claw-proxy's in-process transformers engine in bfloat16 (the engine records the
experts it routed every forwarded token to in the calls' `.routing` side store). An httpx client
plays 8 chat sessions x 4 turns x 48 sampled tokens (proxy seed 0, temperature 1, one call at a
time, so a rerun on the same machine draws the same tokens). `claw-tree samples` tree-packs the
sessions into claw.sample/v1 lines with their routing (`samples.routing`); all rewards are equal,
so the learner's step has no signal and trains nothing. The learner (claw-rl, float32) then runs
its forward without update (`Learner.logprobs`) and its pi_old pass (`Learner.step` on that
no-signal batch: the mismatch and routing metrics, no optimizer step) twice on the same samples:
with routing replay `off` (live top-k) and `r3` (the engine's recorded experts).

Reported per mode, over the sampled (trainable) tokens: mean and max |learner logprob - engine
logprob|, tokens with |diff| > 0.01, and the importance-ratio spread mean / max |exp(diff) - 1|;
and the metric `routing_flip_rate` (the learner's live top-k set vs the engine's recorded one
per (token, layer) row) with its count. Under `off` the forward uses the live top-k, so those
flips are the forward's own; under `r3` the forward uses the recorded experts (no forward flip
by construction) and the metric still compares the live router's choice: layer 0 sees the same
router input in both runs, later layers see hidden states that followed the replayed experts,
so the r3 count may differ a little. A dense control (tests/fixtures/tiny-qwen3, same sessions,
same dtypes) shows the mismatch the bf16-vs-fp32 difference causes without any routing.

Asserted (robust at this size): flips > 0 without replay; with r3 the max and mean |diff| are no
larger than without; the metric's mean equals the per-token mean computed here; the dense
model writes no routing and gives bit-identical logprobs under every replay setting.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import pytest
import torch
from claw_proxy import ProxyConfig, ProxyServer, mint_token
from claw_rl import GRPOConfig, Learner
from claw_rl.records import read_samples
from claw_tree.cli import main as tree_main

ROOT = Path(__file__).resolve().parents[1]
MOE = ROOT / "tests" / "fixtures" / "tiny-qwen3-moe"
DENSE = ROOT / "tests" / "fixtures" / "tiny-qwen3"
SECRET = "bench-secret"
SESSIONS, TURNS, MAX_TOKENS = 8, 4, 48
TAIL = 0.01  # |logprob diff| counted as a tail token


def _bf16_proxy(model: Path, record: Path) -> ProxyServer:
    """claw-proxy on `model` with its transformers engine in bfloat16 (`claw-proxy serve
    --dtype bfloat16`: the model loaded with from_pretrained(dtype=bfloat16))."""
    cfg = ProxyConfig(
        engine=f"transformers:{model}",
        secret=SECRET,
        record=str(record),
        seed=0,
        dtype="bfloat16",
    )
    return ProxyServer(cfg)


def _record(model: Path, d: Path) -> dict:
    """SESSIONS chat sessions of TURNS calls through the bf16 proxy, recorded in d/calls.jsonl;
    the proxy's counters."""
    with _bf16_proxy(model, d / "calls.jsonl") as srv, httpx.Client(timeout=300) as client:
        for s in range(SESSIONS):
            headers = {"authorization": f"Bearer {mint_token(f's{s}', SECRET)}"}
            msgs = [
                {"role": "system", "content": "You are a coding agent in a repository."},
                {
                    "role": "user",
                    "content": f"Task {s}: list the files, then fix the failing test.",
                },
            ]
            for t in range(TURNS):
                body = {"model": "policy", "messages": msgs, "max_tokens": MAX_TOKENS}
                r = client.post(srv.url + "/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                text = r.json()["choices"][0]["message"]["content"] or ""
                msgs += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"Output of step {t}: 3 files, 1 test failed."},
                ]
        return dict(srv.proxy.stats)


def _samples(d: Path) -> Path:
    """Equal rewards (no learning signal), then `claw-tree samples -o samples.jsonl`."""
    with open(d / "outcomes.jsonl", "w") as f:
        for s in range(SESSIONS):
            row = {
                "schema": "claw.outcome/v1",
                "session": f"s{s}",
                "task": "fix",
                "harness": "chat",
            }
            row |= {"group": "fix", "reward": 0.0, "passed": False, "status": "ok"}
            f.write(json.dumps(row) + "\n")
    out = d / "samples.jsonl"
    argv = ["samples", str(d / "calls.jsonl"), str(d / "outcomes.jsonl"), "-o", str(out)]
    tree_main(argv, standalone_mode=False)
    return out


def _learner_pass(model: Path, samples: list, mode: str) -> tuple[dict, list[list[float]]]:
    """The fp32 learner's forward without update and its pi_old pass under routing replay `mode`:
    per-token statistics against the engine's logprobs, the step's metrics."""
    learner = Learner.grpo(GRPOConfig(routing_replay=mode, micro_batch_size=4), model)
    t0 = time.perf_counter()
    lp = learner.logprobs(samples)
    seconds = time.perf_counter() - t0
    metrics = learner.step(samples)  # no signal: the pi_old pass's metrics, no optimizer step
    assert metrics["policy_updates"] == 0 and learner.version == 0
    diff = torch.tensor(
        [
            row[j] - s.logprobs[j]
            for s, row in zip(samples, lp, strict=True)
            for j, trainable in enumerate(s.trainable)
            if trainable
        ],
        dtype=torch.float64,
    )  # (M,) learner - engine over the sampled tokens
    ratio = (diff.exp() - 1).abs()
    stats = {
        "tokens": int(diff.numel()),
        "mean_abs": float(diff.abs().mean()),
        "max_abs": float(diff.abs().max()),
        "tail": int((diff.abs() > TAIL).sum()),
        "ratio_mean": float(ratio.mean()),
        "ratio_max": float(ratio.max()),
        "logprobs_s": seconds,
        "metric_mean_abs": metrics["mismatch_mean_abs"],
    }
    assert math.isclose(stats["metric_mean_abs"], stats["mean_abs"], rel_tol=1e-6, abs_tol=1e-9)
    if "routing_flip_rate" in metrics:
        compared = sum(int((s.routing.load()[..., 0] >= 0).sum()) for s in samples)
        stats["flip_rate"] = metrics["routing_flip_rate"]
        stats["flips"] = round(metrics["routing_flip_rate"] * compared)
        stats["rows"] = compared
    return stats, lp


def _row(name: str, s: dict) -> str:
    flips = f"{s['flips']} / {s['rows']} ({s['flip_rate']:.2%})" if "flips" in s else "-"
    return (
        f"| {name} | {s['tokens']} | {s['mean_abs']:.2e} | {s['max_abs']:.2e} | "
        f"{s['tail']} | {s['ratio_mean']:.2e} | {s['ratio_max']:.2e} | {flips} |"
    )


def _table(rows: dict[str, dict]) -> str:
    head = (
        "| run | sampled tokens | mean abs diff | max abs diff | tokens > 0.01 | "
        "mean abs(ratio-1) | max abs(ratio-1) | routing flips (live vs recorded) |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(_row(name, s) for name, s in rows.items())])


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    t0 = time.perf_counter()
    stats = _record(MOE, d)
    record_s = time.perf_counter() - t0
    samples = read_samples(_samples(d))
    assert all(s.routing is not None for s in samples)
    return {"proxy": stats, "record_s": record_s, "samples": samples}


def test_moe_replay_mismatch(benchmark, moe_run):
    """bf16 engine vs fp32 learner on the tiny MoE: routing flips and logprob mismatch with
    replay off and r3, in one run; r3 removes the routing part of the mismatch."""
    samples = moe_run["samples"]
    off, _ = _learner_pass(MOE, samples, "off")
    r3: dict = {}
    benchmark.pedantic(
        lambda: r3.update(_learner_pass(MOE, samples, "r3")[0]), rounds=1, iterations=1
    )
    proxy = moe_run["proxy"]
    benchmark.extra_info.update(
        off=off, r3=r3, routing_rows_recorded=proxy["routing_rows"], record_s=moe_run["record_s"]
    )
    routing_part = off["mean_abs"] - r3["mean_abs"]
    print(
        f"\nMoE: {SESSIONS} sessions x {TURNS} turns x {MAX_TOKENS} tokens, {len(samples)} samples, "
        f"{proxy['routing_rows']} routing rows recorded ({proxy['routing_bytes']} B), "
        f"recorded in {moe_run['record_s']:.1f}s\n"
        + _table({"MoE, replay off": off, "MoE, replay r3": r3})
        + f"\nrouting part of the mean mismatch (off - r3): {routing_part:.2e} "
        f"({routing_part / off['mean_abs']:.0%} of off); max: {off['max_abs']:.2e} -> "
        f"{r3['max_abs']:.2e}"
    )
    assert off["flips"] > 0
    assert r3["max_abs"] <= off["max_abs"]
    assert r3["mean_abs"] <= off["mean_abs"]
    assert r3["tail"] <= off["tail"]


def test_dense_control(benchmark, tmp_path):
    """The dense tiny Qwen3, same sessions, bf16 engine vs fp32 learner: the mismatch without
    any routing; no routing is written and every replay setting gives the same logprobs."""
    _record(DENSE, tmp_path)
    samples = read_samples(_samples(tmp_path))
    assert all(s.routing is None for s in samples)
    assert not list(tmp_path.glob("*.routing"))
    off, lp_off = _learner_pass(DENSE, samples, "off")
    got: list = []
    benchmark.pedantic(
        lambda: got.extend(_learner_pass(DENSE, samples, "r3")), rounds=1, iterations=1
    )
    r3, lp_r3 = got
    assert lp_r3 == lp_off
    benchmark.extra_info.update(off=off, r3=r3)
    print("\n" + _table({"dense control (off = r3)": off}))
