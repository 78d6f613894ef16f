"""claw-proxy with engine replicas (issue 19): throughput of 2 replicas vs 1 behind one proxy,
and sticky vs random routing seen as prefix-cache hits, in one run.

Run: .venvs/claw-proxy/bin/python -m pytest bench/test_proxy_replicas.py -s -m slow

The engines are fake vLLM servers on loopback ports (packages/claw-proxy/tests/replica_testlib.py)
with an engine's capacity: SLOTS sequences at once, TOKEN_S per sampled token, PREFILL_S per
prompt token not in its prefix cache (16-token blocks salted with the request's cache_salt, hits
counted like vLLM's vllm:prefix_cache_hits / _queries and read from /metrics). SESSIONS
concurrent multi-turn sessions (a session-specific first message, then TURNS turns, each prompt
extending the previous one) go through one `ProxyServer`. Three runs on fresh engines: 1
replica; 2 replicas, sticky; 2 replicas, random. Goals: 2 replicas give >= 1.6x the calls/s of
one; sticky routing's prefix-cache hit rate is above random routing's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "claw-proxy" / "tests"))

from claw_proxy import ProxyConfig, ProxyServer  # noqa: E402
from claw_proxy.render import Renderer  # noqa: E402
from proxy_testlib import SECRET, TINY, token  # noqa: E402
from replica_testlib import FakeVLLM, scrape  # noqa: E402

pytestmark = pytest.mark.slow

SESSIONS, TURNS = 24, 4
SLOTS, TOKEN_S, PREFILL_S = 4, 0.03, 0.0002
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


async def _session(client: httpx.AsyncClient, i: int) -> int:
    """One rollout: TURNS calls, each re-sending the whole conversation."""
    first = f"task {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(60))
    messages = [{"role": "user", "content": first}]
    for turn in range(TURNS):
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": messages, "max_tokens": 16},
            headers={"authorization": f"Bearer {token(f'bench-{i}')}"},
        )
        r.raise_for_status()
        messages += [
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"go on with step {turn + 1}"},
        ]
    return TURNS


def _run(tmp: Path, replicas: int, routing: str) -> dict:
    r = Renderer(str(TINY))
    answer = r.encode("hello from a replica, step done") + [r.eos_ids[0]]
    fakes = [
        FakeVLLM(answer, slots=SLOTS, token_s=TOKEN_S, prefill_s=PREFILL_S).start()
        for _ in range(replicas)
    ]
    cfg = ProxyConfig(
        engine=f"vllm:{fakes[0].url}",
        replicas=tuple(f"vllm:{f.url}" for f in fakes[1:]),
        replica_routing=routing,
        tokenizer=str(TINY),
        secret=SECRET,
        record=str(tmp / f"calls-{replicas}-{routing}.jsonl"),
    )
    try:
        with ProxyServer(cfg) as srv:

            async def drive() -> int:
                limits = httpx.Limits(max_connections=SESSIONS)
                async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as c:
                    await _session(c, -1)  # warm-up (tokenizer, connections), not counted
                    t0 = time.perf_counter()
                    done = await asyncio.gather(*(_session(c, i) for i in range(SESSIONS)))
                    return sum(done), time.perf_counter() - t0

            calls, seconds = asyncio.run(drive())
        metrics = [scrape(f.url) for f in fakes]
    finally:
        for f in fakes:
            f.stop()
    queries = sum(m["queries"] for m in metrics)
    hits = sum(m["hits"] for m in metrics)
    return {
        "replicas": replicas,
        "routing": routing,
        "calls": calls,
        "seconds": round(seconds, 3),
        "calls_per_s": round(calls / seconds, 2),
        "prefix_hit_rate": round(hits / queries, 4),
        "per_replica_queries": [int(m["queries"]) for m in metrics],
    }


def test_two_replicas_vs_one_and_sticky_vs_random(tmp_path):
    """2 replicas serve >= 1.6x the calls/s of 1; sticky routing hits the prefix cache more than
    random routing does."""
    one = _run(tmp_path, 1, "sticky")
    sticky = _run(tmp_path, 2, "sticky")
    rand = _run(tmp_path, 2, "random")
    for row in (one, sticky, rand):
        print(row)
    speedup = sticky["calls_per_s"] / one["calls_per_s"]
    print(
        f"2 replicas / 1: {speedup:.2f}x calls/s; prefix-cache hit rate sticky "
        f"{sticky['prefix_hit_rate']:.3f} vs random {rand['prefix_hit_rate']:.3f}"
    )
    assert speedup >= 1.6
    assert sticky["prefix_hit_rate"] > rand["prefix_hit_rate"] + 0.1
