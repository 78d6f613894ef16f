"""Fuzzed requests: captured harness requests, mutated with a fixed seed, sent over HTTP.

Every answer must be a 2xx or a 4xx with an error body (never a 5xx), the server must stay
healthy, and every record written must be valid JSON (no NaN, no lone surrogate).
`bench/test_proxy_fuzz.py` runs the same generator at 5,000 requests.
"""

from __future__ import annotations

import copy
import json
import random

import httpx
from proxy_testlib import HARNESS_REQUESTS, token

# values that broke the proxy once, and other shapes a parser meets rarely
_ODD = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5e308,
    "",
    "\ud800",
    "x\udfff",
    "\x00",
    "\u2063claw-anchor\u2063",
    "<tool_call>\n{}\n</tool_call>",
    "<|im_end|>",
    {},
    [],
    [[]],
    {"type": {}},
    {"type": "refusal", "refusal": 5},
    {"type": "text"},
    {"type": "text", "text": 7},
    {"type": "image_url", "image_url": {"url": "data:"}},
    {"role": "assistant", "content": None, "tool_calls": [{"id": 1, "function": {}}]},
]
_RAW = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"\\ud800"', b"[" * 1200 + b"]" * 1200]


def _nodes(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*path, i))


def _set(root, path, value):
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _delete(root, path):
    node = root
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]


def _mutate(rnd: random.Random, body: dict) -> bytes:
    """One mutated request body (bytes: some mutations are not JSON at all)."""
    body = copy.deepcopy(body)
    for _ in range(rnd.randint(1, 3)):
        nodes = [p for p, _ in _nodes(body) if p]
        if not nodes:
            break
        path = rnd.choice(nodes)
        op = rnd.random()
        if op < 0.45:
            _set(body, path, copy.deepcopy(rnd.choice(_ODD)))
        elif op < 0.6:
            _delete(body, path)
        elif op < 0.7:  # deep nesting, spliced in as text below
            _set(body, path, f"@deep{rnd.choice([50, 126, 130, 999, 1001, 5000])}@")
        else:
            _set(body, path, rnd.choice(["", "a" * rnd.randint(1, 5000), 3, [1], {"a": 1}]))
    raw = json.dumps(body, ensure_ascii=rnd.random() < 0.5).encode("utf-8", "surrogatepass")
    for depth in (50, 126, 130, 999, 1001, 5000):
        raw = raw.replace(f'"@deep{depth}@"'.encode(), b"[" * depth + b'"x"' + b"]" * depth)
    r = rnd.random()
    if r < 0.1:  # cut it anywhere
        raw = raw[: rnd.randint(0, len(raw))]
    elif r < 0.2:  # splice a literal JSON cannot hold into a value position
        i = raw.find(b":", rnd.randint(0, len(raw)))
        if i > 0:
            j = raw.find(b",", i)
            raw = raw[: i + 1] + rnd.choice(_RAW) + (raw[j:] if j > 0 else b"}")
    elif r < 0.25:  # bytes that are not UTF-8
        i = rnd.randint(0, len(raw))
        raw = raw[:i] + bytes(rnd.randint(128, 255) for _ in range(3)) + raw[i:]
    return raw


def fuzz_cases(seed: int, n: int) -> list[tuple[str, bytes, bool]]:
    """`n` (path, body bytes, chunked) cases from the captured harness requests."""
    rnd = random.Random(seed)
    captured = [json.loads(p.read_text()) for p in sorted(HARNESS_REQUESTS.glob("*.json"))]
    cases = []
    for _ in range(n):
        c = rnd.choice(captured)
        cases.append((c["path"].split("?")[0], _mutate(rnd, c["body"]), rnd.random() < 0.1))
    return cases


def run_fuzz(srv, cases, session_prefix="fz") -> dict:
    """Send the cases; return counts by status class and the 5xx answers (path, status, text)."""
    counts = {"2xx": 0, "4xx": 0, "5xx": 0, "other": 0}
    bad = []
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        for i, (path, raw, chunked) in enumerate(cases):
            key = token(f"{session_prefix}{i % 50}")
            headers = {
                "x-api-key": key,
                "authorization": f"Bearer {key}",
                "content-type": "application/json",
                "anthropic-version": "2023-06-01",
            }
            content = iter([raw[: len(raw) // 2], raw[len(raw) // 2 :]]) if chunked else raw
            r = client.post(path, content=content, headers=headers)
            group = f"{r.status_code // 100}xx"
            counts[group if group in counts else "other"] += 1
            if r.status_code >= 500:
                bad.append((path, r.status_code, r.text[:300]))
            elif r.status_code >= 400:
                assert "error" in r.json(), r.text
        assert client.get("/healthz").status_code == 200
    return {**counts, "bad": bad}


def _strict(line: str) -> dict:
    def refuse(c):
        raise ValueError(f"non-JSON constant {c}")

    d = json.loads(line, parse_constant=refuse)
    json.dumps(d).encode("utf-8")  # a lone surrogate would fail here
    return d


def test_fuzzed_requests_get_no_5xx(make_server, tmp_path):
    """200 seeded mutations of real harness requests: no 5xx, still healthy, records valid."""
    srv = make_server(["hi", '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'])
    out = run_fuzz(srv, fuzz_cases(seed=14, n=200))
    assert out["bad"] == [] and out["5xx"] == 0
    assert out["4xx"] > 50 and out["2xx"] > 20  # the mutations reach both outcomes
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert len(lines) == out["2xx"]
    for line in lines:
        _strict(line)
