"""claw-proxy's MoE routing store (issue 40): its bytes per token, and what recording the experts
costs the in-process engine.

Run: .venvs/claw-proxy/bin/python -m pytest bench/test_proxy_routing.py --benchmark-only -s

- `test_store_bytes_per_token`: a 6-turn chat session on a tiny Qwen3-MoE (3 layers, one dense:
  L = 2 MoE layers, top-2 of 8 experts, uint8): bytes of the `.routing` file per token against
  L x K x 1 byte, and the rows stored with delta storage (`routing.start`: a turn stores only the
  tokens after its parent's) against storing every call's whole sequence. The formula for
  Qwen3-30B-A3B: 48 MoE layers x top-8 x 1 byte (128 experts: uint8) = 384 B per token.
- `test_writer_cost_qwen3_30b`: CallWriter.write of a turn adding 512 tokens with Qwen3-30B-A3B's
  routing (512 x 48 x 8 uint8 = 196,608 bytes) beside its line.
- `test_engine_capture_cost`: per-token decode time of the same MoE with router hooks (capture)
  and without (the hooks removed), interleaved in one run; the ratio is the cost of capture.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "claw-proxy" / "tests"))

from claw_proxy import Call, CallWriter, ProxyConfig, ProxyServer, RoutingRows, read_calls  # noqa: E402
from moe_testlib import build_tiny_moe  # noqa: E402
from proxy_testlib import SECRET, token  # noqa: E402

QWEN3_30B_A3B = {"layers": 48, "top_k": 8, "experts": 128}


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    return build_tiny_moe(tmp_path_factory.mktemp("moe"))


def test_store_bytes_per_token(benchmark, moe, tmp_path):
    """Bytes of routing per stored token, and delta storage's saving over a 6-turn session."""
    import openai

    rec = tmp_path / "calls.jsonl"

    def session():
        for f in tmp_path.glob("calls*"):
            f.unlink()
        with ProxyServer(
            ProxyConfig(engine=f"transformers:{moe}", secret=SECRET, record=str(rec))
        ) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key=token("b"), max_retries=0)
            msgs = [{"role": "user", "content": "list the files"}]
            for turn in range(6):
                r = client.chat.completions.create(model="m", messages=msgs, max_tokens=16)
                msgs += [
                    {"role": "assistant", "content": r.choices[0].message.content or ""},
                    {"role": "user", "content": f"now step {turn}"},
                ]

    benchmark.pedantic(session, rounds=1, iterations=1)
    calls = list(read_calls(rec))
    stored = sum(c.routing["shape"][0] for c in calls)
    whole = sum(len(c.prompt_ids) + len(c.completion_ids) - 1 for c in calls)
    size = (tmp_path / "calls.routing").stat().st_size - 8
    L, K = calls[0].routing["shape"][1:]
    per_token = size / stored
    q = QWEN3_30B_A3B
    info = {
        "tiny_bytes_per_token": per_token,
        "tiny_formula": L * K,
        "rows_stored": stored,
        "rows_without_delta": whole,
        "delta_saving": whole / stored,
        "routing_bytes": size,
        "jsonl_bytes": rec.stat().st_size,
        "qwen3_30b_a3b_bytes_per_token": q["layers"] * q["top_k"],
        "qwen3_30b_a3b_session_bytes": q["layers"] * q["top_k"] * stored,
    }
    benchmark.extra_info.update(info)
    print(f"\nrouting store: {info}")
    assert per_token == L * K  # uint8, no per-array header
    assert [c.routing.get("start", 0) > 0 for c in calls] == [False] + [True] * 5


def test_writer_cost_qwen3_30b(benchmark, tmp_path):
    """Writing one call line with Qwen3-30B-A3B routing for 512 new tokens (delta rows)."""
    q = QWEN3_30B_A3B
    rows = np.random.default_rng(0).integers(0, q["experts"], (512, q["layers"], q["top_k"]))
    rows = rows.astype(np.uint8)
    d = {
        "schema": "claw.call/v1",
        "call_id": "c",
        "session": "s",
        "seq": 0,
        "api": "openai.chat",
        "model": "m",
        "policy": {"name": "p", "version": 0},
        "prompt_ids": list(range(1, 2000)),
        "completion_ids": [7] * 500,
        "completion_logprobs": [-0.5] * 500,
        "finish_reason": "stop",
        "started_at": 1.0,
        "ended_at": 2.0,
        "tags": {},
    }
    call = Call.from_dict(d)
    w = CallWriter(tmp_path / "calls.jsonl")
    plain = CallWriter(tmp_path / "plain.jsonl")

    def write():
        w.write(call, routing=RoutingRows(rows=rows, experts=q["experts"]))

    plain_times = []
    for _ in range(50):
        t0 = time.perf_counter()
        plain.write(call)
        plain_times.append(time.perf_counter() - t0)
    without = statistics.median(plain_times)
    benchmark.pedantic(write, rounds=50, iterations=1)
    w.close()
    plain.close()
    with_ms = benchmark.stats.stats.median * 1e3
    benchmark.extra_info.update(
        routing_bytes=rows.nbytes, write_ms=with_ms, write_without_routing_ms=without * 1e3
    )
    print(
        f"\nwrite of a 2.5K-token call: {without * 1e3:.3f} ms without routing, "
        f"{with_ms:.3f} ms with {rows.nbytes} routing bytes (median)"
    )


def test_engine_capture_cost(benchmark, moe):
    """Per-token decode time with and without router hooks, interleaved (4 rows x 48 tokens)."""
    from claw_proxy._transformers import TransformersEngine, _Routers
    from claw_proxy.engines import GenRequest

    async def main():
        engine = TransformersEngine(str(moe), max_batch=8, batch_wait=0.02)
        model = engine._current[0]

        def capture(on: bool) -> None:
            routers = engine._routers.get(model)
            if routers is not None:
                for h in routers.handles:
                    h.remove()
            engine._routers[model] = _Routers.of(model) if on else None
            engine.routes = on

        async def decode() -> float:
            reqs = [
                GenRequest(prompt_ids=list(range(5, 40)), max_tokens=48, seed=i) for i in range(4)
            ]
            batches = engine.batches
            t0 = time.perf_counter()
            gens = [engine.generate(r) for r in reqs]
            n = 0
            for g in gens:
                async for chunk in g.chunks():
                    n += len(chunk)
            took = (time.perf_counter() - t0) / n
            while engine.batches == batches:  # the worker has left the batch: hooks may change
                await asyncio.sleep(0.001)
            return took

        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(7):
            for on in (False, True):
                capture(on)
                times[on].append(await decode())
        capture(True)
        await engine.aclose()
        return times

    times = benchmark.pedantic(lambda: asyncio.run(main()), rounds=1, iterations=1)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    step_us = _bookkeeping_us(moe)
    benchmark.extra_info.update(
        ms_per_token_capture=on * 1e3,
        ms_per_token_plain=off * 1e3,
        ratio=on / off,
        bookkeeping_us_per_step=step_us,
    )
    print(
        f"\nengine per token: {off * 1e3:.3f} ms without capture, {on * 1e3:.3f} ms with "
        f"(ratio {on / off:.3f}, medians of 7 interleaved runs); the capture's own work per "
        f"4-row decode step (take + per-row append): {step_us:.1f} us"
    )


def _bookkeeping_us(moe: Path) -> float:
    """Microseconds of `_Routers.take` and the per-row appends for one 4-row decode step."""
    import torch
    from claw_proxy._transformers import _Routers
    from transformers import AutoModelForCausalLM

    routers = _Routers.of(AutoModelForCausalLM.from_pretrained(moe))
    assert routers is not None
    got = [torch.randint(0, 8, (4, 2)) for _ in routers.handles]
    rows: list[list] = [[] for _ in range(4)]
    t0 = time.perf_counter()
    for _ in range(2000):
        routers._got = list(got)
        step = routers.take(4, 1)
        for i in range(4):
            rows[i].append(step[i])
    return (time.perf_counter() - t0) / 2000 * 1e6
