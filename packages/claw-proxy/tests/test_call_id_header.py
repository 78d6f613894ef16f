"""Every answered call names its claw.call/v1 record in the ``x-claw-call-id`` header, streamed
or not, so a client (claw-bench's rubric judge) can link its verdict to the recorded call."""

from __future__ import annotations

import json

import httpx
from claw_proxy import read_calls
from proxy_testlib import token


def test_the_call_id_header_names_the_recorded_call(make_server, tmp_path):
    """Non-streamed and streamed answers carry the call_id their records hold."""
    srv = make_server(["first", "second"])
    h = {"content-type": "application/json", "authorization": f"Bearer {token('s1')}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        whole = c.post("/v1/chat/completions", content=json.dumps(body), headers=h)
        with c.stream(
            "POST", "/v1/chat/completions", content=json.dumps({**body, "stream": True}), headers=h
        ) as streamed:
            streamed.read()
    assert whole.status_code == 200 and streamed.status_code == 200
    ids = [whole.headers["x-claw-call-id"], streamed.headers["x-claw-call-id"]]
    recorded = [c.call_id for c in read_calls(tmp_path / "calls.jsonl")]
    assert ids[0] != ids[1] and sorted(recorded) == sorted(ids)
