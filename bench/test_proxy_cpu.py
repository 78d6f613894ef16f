"""claw-proxy CPU time per call as a session's context grows: turn 1 vs turn 50 (~100k tokens).

Run: .venvs/claw-proxy/bin/python -m pytest bench/test_proxy_cpu.py --benchmark-only -s

The proxy's ASGI app is driven in-process (no HTTP client in the measurement) with a scripted
zero-latency engine and the drift check off (it re-renders the whole prompt on purpose; its
cost is reported separately); `time.process_time` around each call covers everything the proxy does for
it: JSON parsing, auth, prefix matching, rendering and tokenizing the new turns, the engine
round trip, parsing the tool call, formatting the answer and writing the record. The harness
side builds a Claude-Code-like conversation: a ~8k-token system prompt and tools, then each
turn a tool call and a ~2k-token tool result, reaching ~100k tokens at turn 50.
Target (issue 4): turn-50 CPU time within 2x of turn 1.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import pytest
from claw_proxy import ProxyConfig, mint_token
from claw_proxy.server import Proxy

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
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
    "rho",
]


def _text(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str(i % 97) for i in range(n_words))


async def _call(app, body: bytes, key: str, path: str = "/v1/messages") -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"beta=true",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"x-api-key", key.encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent = False
    status, out = 0, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    async def send(msg):
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        elif msg["type"] == "http.response.body":
            out.append(msg.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(out)


def run_session(turns: int = 50, tool_words: int = 330, drift_check_tokens: int = 0) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="claw-proxy-bench-"))
    script = tmp / "script.jsonl"
    call = '<tool_call>\n{"name": "Bash", "arguments": {"command": "cat notes.txt"}}\n</tool_call>'
    script.write_text(json.dumps({"text": call}) + "\n")
    proxy = Proxy(
        ProxyConfig(
            engine=f"scripted:{script}",
            tokenizer=str(TINY),
            secret="s",
            record=str(tmp / "calls.jsonl"),
            drift_check_tokens=drift_check_tokens,
        )
    )
    key = mint_token("bench", "s")
    tools = [
        {
            "name": f"Tool{i}",
            "description": _text(60, i),
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
        for i in range(12)
    ]
    body = {
        "model": "claude-opus-4",
        "max_tokens": 64,
        "stream": True,
        "system": _text(600, 99),
        "tools": tools,
        "messages": [{"role": "user", "content": "do the task"}],
    }
    cpu, prompt_tokens = [], []

    async def main():
        for turn in range(turns):
            raw = json.dumps(body).encode()
            t0 = time.process_time()
            status, out = await _call(proxy.app, raw, key)
            cpu.append(time.process_time() - t0)
            assert status == 200, out[:300]
            use_id = f"toolu_{turn}"
            body["messages"] += [
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": use_id,
                            "name": "Bash",
                            "input": {"command": "cat notes.txt"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use_id,
                            "content": _text(tool_words, turn),
                        }
                    ],
                },
            ]

    asyncio.run(main())
    from claw_proxy import read_calls

    calls = list(read_calls(tmp / "calls.jsonl"))
    prompt_tokens = [len(c.prompt_ids) for c in calls]
    assert all(c.prefix["parent_call"] == p.call_id for p, c in zip(calls, calls[1:], strict=False))
    return {"cpu": cpu, "prompt_tokens": prompt_tokens}


@pytest.mark.benchmark(group="proxy-cpu")
def test_cpu_turn_1_vs_turn_50(benchmark):
    res = benchmark.pedantic(run_session, rounds=1, iterations=1)
    cpu, toks = res["cpu"], res["prompt_tokens"]
    first = statistics.median(cpu[1:4])  # turn 1 = the first reusing turn after the opening render
    last = statistics.median(cpu[-3:])
    print(f"\nopening call: {cpu[0] * 1e3:.2f} ms CPU, {toks[0]} prompt tokens")
    print(
        f"turn 1: {first * 1e3:.2f} ms CPU at {toks[1]} tokens; turn 50: {last * 1e3:.2f} ms CPU at {toks[-1]} tokens;"
        f" ratio {last / first:.2f} (target <= 2)"
    )
    benchmark.extra_info.update(
        turn1_ms=first * 1e3,
        turn50_ms=last * 1e3,
        ratio=last / first,
        opening_ms=cpu[0] * 1e3,
        tokens_turn50=toks[-1],
    )
    assert toks[-1] > 90_000


@pytest.mark.benchmark(group="proxy-cpu")
def test_cpu_with_drift_check(benchmark):
    """The same session with the drift check (a full re-render) on up to 16k-token prompts."""
    res = benchmark.pedantic(
        run_session, kwargs={"turns": 8, "drift_check_tokens": 16384}, rounds=1, iterations=1
    )
    cpu, toks = res["cpu"], res["prompt_tokens"]
    print(
        "\nwith drift check: "
        + ", ".join(f"{c * 1e3:.1f} ms @ {t}" for c, t in zip(cpu, toks, strict=True))
    )
    benchmark.extra_info.update(drift_ms=[c * 1e3 for c in cpu], tokens=toks)


if __name__ == "__main__":
    r = run_session()
    print([round(c * 1e3, 2) for c in r["cpu"]], r["prompt_tokens"][::10])
