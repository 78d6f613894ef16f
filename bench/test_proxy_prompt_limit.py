"""claw-proxy: how long a 4 MB over-limit prompt holds the proxy before its 413 (issue 39
item 8), for the tiny test tokenizer (--max-prompt-tokens 170000: 4 MB / its 26-byte longest
token stays under it) and a byte-level BPE vocabulary trained here (longest token 512 bytes,
--max-prompt-tokens 10000).

Run: .venvs/claw-proxy/bin/python -m pytest bench/test_proxy_prompt_limit.py -s -m slow

Prints the seconds to the 413 and the characters the counting tokenizer saw. Goal: the 413
comes after counting up to the limit (well under a second here), not after rendering and
tokenising all 4 MB (40 s and more before the fix).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "claw-proxy" / "tests"))

from claw_proxy import ProxyConfig, ProxyServer  # noqa: E402
from proxy_testlib import SECRET, TINY, bpe_dir, token, write_script  # noqa: E402

pytestmark = pytest.mark.slow


def _text(n_chars: int) -> str:
    words = [f"w{i % 9973}x" for i in range(n_chars // 4)]
    return " ".join(words)[:n_chars]


@pytest.mark.parametrize("name", ["tiny", "bpe"])
def test_4mb_prompt_over_the_limit(tmp_path, name):
    """Seconds from sending a 4 MB prompt to its 413."""
    d = TINY if name == "tiny" else bpe_dir(tmp_path / "bpe")
    limit = 170_000 if name == "tiny" else 10_000
    script = write_script(tmp_path / "script.jsonl", ["hello"])
    cfg = ProxyConfig(
        engine=f"scripted:{script}",
        tokenizer=str(d),
        secret=SECRET,
        record=str(tmp_path / "calls.jsonl"),
        max_prompt_tokens=limit,
        max_body_bytes=32 << 20,
    )
    srv = ProxyServer(cfg).start()
    try:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": _text(4 << 20)}]})
        h = {"x-api-key": token("big"), "content-type": "application/json"}
        t0 = time.perf_counter()
        r = httpx.post(srv.url + "/v1/chat/completions", content=body, headers=h, timeout=900)
        seconds = time.perf_counter() - t0
        floor = getattr(srv.proxy.bounds[str(d)], "floor", None)
        seen = floor.counted_chars if floor is not None else None
        print(
            f"\n{name}: limit {limit}: {r.status_code} after {seconds:.2f} s; counted {seen} chars"
        )
        print("  ", r.json()["error"]["message"])
        assert r.status_code == 413
    finally:
        srv.stop()
