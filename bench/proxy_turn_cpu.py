"""claw-proxy's own CPU per call in vllm mode, by turn, measured in-process (issue 41).

Run: .venvs/claw-proxy/bin/python bench/proxy_turn_cpu.py [--sessions 16] [--turns 50]
     [--profile out.prof] [--src OTHER_SRC ...]

The conversation is bench/test_proxy_engine_speed.py's (a ~1.7K-token system prompt and six
tools, then per turn a bash tool call sampled by the engine and a ~400-token tool result), the
engine `bench/fake_vllm.py` in a process of its own, the proxy `Proxy(ProxyConfig(engine=
"vllm:..."))` with default flags driven over ASGI in this process (no HTTP client in the
measurement): `time.process_time` around each call covers the proxy's event loop and its worker
threads, not the fake engine. Requests are not streamed (what the bench's harness sends).

With `--src A --src B` each source tree of `claw_proxy` runs in its own child process, in turns
(A, B, A, B, ...: `--rounds` each), and the table gives each round's figures side by side, so a
loaded machine slows both alike. With `--profile FILE` the turn-`--turns` calls run under
cProfile (the event loop's thread only) and the top of the profile is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from test_proxy_cpu import _call  # noqa: E402  (one in-process ASGI call, as that bench makes it)

CHAT = "/v1/chat/completions"


def _fake_engine():
    """Start bench/fake_vllm.py answering the bench's tool call; its URL and process."""
    from proc_stats import free_port, wait_ready
    from test_proxy_engine_speed import ANSWER_TEXT, TINY
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    ids = tok.encode(ANSWER_TEXT, add_special_tokens=False) + [tok.eos_token_id]
    pieces = [tok.decode(ids[: i + 1])[len(tok.decode(ids[:i])) :] for i in range(len(ids))]
    port = free_port()
    argv = [str(ROOT / "bench" / "fake_vllm.py"), str(port), json.dumps(ids), "hi there"]
    proc = subprocess.Popen([sys.executable, *argv, json.dumps(pieces)])
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/healthz", proc)
    return url, proc


def measure(url: str, sessions: int, turns: int, profile: str | None) -> dict:
    """CPU ms per call at each turn (mean over sessions) of one proxy in this process."""
    from claw_proxy import ProxyConfig, mint_token
    from claw_proxy.server import Proxy
    from test_proxy_engine_speed import TINY, TOOLS, _text

    tmp = Path(tempfile.mkdtemp(prefix="claw-proxy-turn-cpu-"))
    proxy = Proxy(
        ProxyConfig(
            engine=f"vllm:{url}", tokenizer=str(TINY), secret="s", record=str(tmp / "c.jsonl")
        )
    )
    system = "You are a coding agent. " + _text(220, 1)
    convs = [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"task {s}: " + _text(60, s)},
        ]
        for s in range(sessions)
    ]
    keys = [mint_token(f"s{s}", "s") for s in range(sessions)]
    cpu: dict[int, list[float]] = {}
    prof = cProfile.Profile(time.thread_time_ns, 1e-9) if profile else None

    async def main():
        for turn in range(1, turns + 1):
            for s, msgs in enumerate(convs):
                body = json.dumps({"model": "policy", "messages": msgs, "tools": TOOLS}).encode()
                on = prof is not None and turn == turns
                if on:
                    prof.enable()
                t0 = time.process_time()
                status, out = await _call(proxy.app, body, keys[s], CHAT)
                cpu.setdefault(turn, []).append(time.process_time() - t0)
                if on:
                    prof.disable()
                if status != 200:
                    raise RuntimeError(f"turn {turn}: {status} {out[:300]!r}")
                call = json.loads(out)["choices"][0]["message"]["tool_calls"][0]
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": _text(70, turn * 31 + s),
                    }
                )
        await proxy.aclose()

    asyncio.run(main())
    if prof is not None:
        prof.dump_stats(profile)
    return {t: statistics.mean(v) * 1e3 for t, v in cpu.items()}


def _report(turns: int, rows: dict) -> dict:
    late = [t for t in range(max(2, turns - 4), turns + 1)]
    return {
        "turn2": rows[2],
        "turn_last": statistics.median(rows[t] for t in late),  # the last 5 turns' median
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--profile", help="cProfile the last turn's calls into this file")
    ap.add_argument("--src", action="append", default=[], help="a claw_proxy source tree")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--url", help=argparse.SUPPRESS)  # a child: the fake engine's URL
    a = ap.parse_args()
    if a.src:
        url, proc = _fake_engine()
        try:
            for r in range(a.rounds):
                for src in a.src:
                    env = {**os.environ, "PYTHONPATH": src}
                    argv = [sys.executable, __file__, "--url", url]
                    argv += ["--sessions", str(a.sessions), "--turns", str(a.turns)]
                    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
                    print(f"round {r + 1} {src}: {out.stdout.strip()}", flush=True)
        finally:
            proc.kill()
            proc.wait()
        return
    proc = None
    url = a.url
    if url is None:
        url, proc = _fake_engine()
    try:
        rows = measure(url, a.sessions, a.turns, a.profile)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    rep = _report(a.turns, rows)
    print(
        f"CPU per call: turn 2 {rep['turn2']:.2f} ms, turn {a.turns} {rep['turn_last']:.2f} ms, "
        f"ratio {rep['turn_last'] / rep['turn2']:.2f}x"
    )
    if a.profile:
        pstats.Stats(a.profile).sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
