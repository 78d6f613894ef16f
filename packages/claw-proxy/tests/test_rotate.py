"""Record rotation (issue 19): `POST /admin/rotate` closes the open shard, so a training step
reads only the calls since the previous step, and no call is lost or read twice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from claw_proxy import Call, CallWriter, read_calls
from proxy_testlib import ADMIN, token

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}


def _call(i: int) -> Call:
    return Call.from_dict(
        {
            "schema": "claw.call/v1",
            "call_id": f"c{i}",
            "session": "s",
            "seq": i,
            "api": "openai.chat",
            "model": "m",
            "policy": {"name": "p", "version": 0},
            "prompt_ids": list(range(40)),
            "completion_ids": [3],
            "completion_logprobs": [-0.5],
            "finish_reason": "stop",
            "started_at": 1.0,
            "ended_at": 2.0,
            "tags": {},
        }
    )


def _lines(path: str) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def test_rotate_lists_the_shards_closed_since_the_last_rotation(tmp_path):
    """rotate() returns every shard closed since the previous rotation (size-rolled ones too)
    with their line count; a writer reopened on the series counts the open shard's lines."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path)
    for i in range(3):
        w.write(_call(i))
    r1 = w.rotate()
    assert r1 == {"closed": [str(path)], "lines": 3, "next": str(tmp_path / "calls.00001.jsonl")}
    assert w.rotate() == {
        "closed": [str(tmp_path / "calls.00001.jsonl")],
        "lines": 0,
        "next": str(tmp_path / "calls.00002.jsonl"),
    }
    w.write(_call(3))
    w.close()
    w = CallWriter(path, max_bytes=1200)  # a restarted proxy appends to calls.00002.jsonl
    for i in range(4, 10):
        w.write(_call(i))
    r3 = w.rotate()
    w.close()
    assert r3["closed"][0] == str(tmp_path / "calls.00002.jsonl") and len(r3["closed"]) > 1
    assert r3["lines"] == 7 == sum(len(_lines(p)) for p in r3["closed"])
    assert [c.seq for c in read_calls(path)] == list(range(10))


async def _hammer(url: str, n: int, rotations: int) -> tuple[list[str], list[dict]]:
    """n chat calls from n sessions, 16 at a time, while `rotations` rotations run."""
    answered: list[str] = []
    rotated: list[dict] = []
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]},
                    headers={"authorization": f"Bearer {token(f's{i}')}"},
                )
                assert r.status_code == 200, r.text
                answered.append(r.json()["id"])

        async def rotate() -> None:
            for _ in range(rotations):
                r = await c.post("/admin/rotate", headers=ADMIN_H)
                assert r.status_code == 200, r.text
                rotated.append(r.json())
                await asyncio.sleep(0)

        await asyncio.gather(rotate(), *(one(i) for i in range(n)))
        r = await c.post("/admin/rotate", headers=ADMIN_H)
        rotated.append(r.json())
    return answered, rotated


def test_rotation_under_concurrent_calls_loses_and_duplicates_nothing(make_server):
    """With 120 calls in flight across 15 rotations, the closed shards hold every answered call
    exactly once, each rotation's line count is the lines its shards hold, and reading the
    whole series gives the same calls."""
    srv = make_server(["hello"])
    answered, rotated = asyncio.run(_hammer(srv.url, 120, 15))
    assert len(answered) == 120 and len(rotated) == 16
    seen: list[str] = []
    for r in rotated:
        rows = [row for p in r["closed"] for row in _lines(p)]
        assert len(rows) == r["lines"]
        seen += [row["call_id"] for row in rows]
    assert len(seen) == 120 == len(set(seen))
    assert sorted(c.call_id for c in read_calls(srv.config.record)) == sorted(seen)
    assert rotated[-1]["next"] == str(Path(srv.config.record).with_name("calls.00016.jsonl"))


def test_rotate_needs_the_admin_token_and_a_record_file(make_server):
    """Rotation is an admin call; a proxy that records nothing says so (400)."""
    srv = make_server(["hello"])
    assert httpx.post(srv.url + "/admin/rotate").status_code == 401
    bare = make_server(["hello"], record=None)
    r = httpx.post(bare.url + "/admin/rotate", headers=ADMIN_H)
    assert r.status_code == 400 and "--record" in r.json()["error"]["message"]
