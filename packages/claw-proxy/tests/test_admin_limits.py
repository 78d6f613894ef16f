"""Auth, admin API, policy reload, routes, limits and error shapes."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, api_chat, mint_token, read_calls
from claw_proxy.engines import Engine, Generation
from claw_proxy.errors import EngineError
from proxy_testlib import ADMIN, SECRET, TINY, token

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTH = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def _post(srv, path, body, key=None, raw=None, **headers):
    h = {"content-type": "application/json", **headers}
    if key is not None:
        h["x-api-key"] = key
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        return c.post(path, content=raw if raw is not None else json.dumps(body), headers=h)


def test_auth(make_server):
    """No key, a forged key or a key of another secret: 401 in each API's error shape."""
    srv = make_server()
    r = _post(srv, "/v1/chat/completions", CHAT)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    forged = token("s1")[:-2] + "AA"
    r = _post(srv, "/v1/messages", ANTH, key=forged)
    assert (
        r.status_code == 401
        and r.json()["type"] == "error"
        and r.json()["error"]["type"] == "authentication_error"
    )
    assert (
        _post(srv, "/v1/chat/completions", CHAT, key=mint_token("s1", "other")).status_code == 401
    )
    r = _post(srv, "/v1/chat/completions", CHAT, authorization=f"Bearer {token('s1')}")
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "raw", "needle"),
    [
        ("/v1/chat/completions", None, b"{not json", "not valid JSON: Expecting property name"),
        ("/v1/chat/completions", [1], None, "must be a JSON object"),
        ("/v1/chat/completions", {"model": "m"}, None, "messages: required field is missing"),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": "hi"},
            None,
            "messages: expected an array",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
            None,
            "messages[0].role: unknown role 'robot'",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:"}}],
                    }
                ],
            },
            None,
            "messages[0].content[0]: image_url content is not supported",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            None,
            "temperature: expected a number",
        ),
        (
            "/v1/messages",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            None,
            "max_tokens: required",
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            None,
            "messages[0].content[0]: image content is not supported",
        ),
        (
            "/v1/responses",
            {
                "model": "m",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_image"}]}
                ],
            },
            None,
            "input[0].content[0]",
        ),
        (
            "/v1/responses",
            {"model": "m", "input": "x", "previous_response_id": "r1"},
            None,
            "previous_response_id",
        ),
    ],
)
def test_bad_requests_get_400_with_a_clear_message(make_server, path, body, raw, needle):
    """Malformed JSON, wrong types, unknown roles, images: 400 naming the field, in the API's shape."""
    srv = make_server()
    r = _post(srv, path, body, key=token(), raw=raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"], err["message"]
    assert err["type"] == "invalid_request_error"
    assert ("type" in r.json()) == (path == "/v1/messages")
    assert srv.proxy.writer.written == 0


def test_body_limit_and_max_tokens_cap(make_server):
    """Bodies over the limit get 413; max tokens are capped and the cap is recorded."""
    srv = make_server(["a b c d e f g h i j k l m n o p"], max_body_bytes=2000, max_tokens_cap=3)
    r = _post(
        srv,
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "x" * 3000}]},
        key=token(),
    )
    assert r.status_code == 413
    r = _post(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 100}, key=token())
    assert (
        r.json()["usage"]["completion_tokens"] == 3
        and r.json()["choices"][0]["finish_reason"] == "length"
    )
    (call,) = read_calls(srv.config.record)
    assert call.sampling["max_tokens"] == 3 and call.finish_reason == "length"


class _Gate(Engine):
    """A fake engine that holds every generation until released, or fails."""

    spec = "gate"

    def __init__(self, tokenizer_dir, fail=False):
        super().__init__()
        self.tokenizer_dir = tokenizer_dir
        self.release = threading.Event()
        self.fail = fail

    def generate(self, req):
        gen = Generation()
        loop = asyncio.get_running_loop()

        def run():
            if self.fail:
                gen.put("error", EngineError("GPU fell over"))
                return
            self.release.wait(10)
            gen.put("policy", {"name": "gate", "version": 3})
            gen.put("tokens", [(2, -0.5)])
            gen.put("end", "stop")

        loop.run_in_executor(None, run)
        return gen


def test_session_concurrency_and_engine_failure(make_server):
    """Over the per-session limit: 429 with retry-after. Engine failure: 529 (Anthropic) / 503
    (OpenAI) with retry-after, and nothing recorded."""
    srv = make_server(session_concurrency=1)
    gate = _Gate(str(TINY))
    srv.proxy.policy_engine = gate
    results = {}
    t = threading.Thread(
        target=lambda: results.setdefault(
            "a", _post(srv, "/v1/chat/completions", CHAT, key=token("c"))
        )
    )
    t.start()
    for _ in range(200):
        if srv.proxy.sessions.get("c") and srv.proxy.sessions["c"].in_flight:
            break
        threading.Event().wait(0.01)
    r = _post(srv, "/v1/chat/completions", CHAT, key=token("c"))
    assert r.status_code == 429 and "retry-after" in r.headers
    gate.release.set()
    t.join()
    assert results["a"].status_code == 200
    recorded = list(read_calls(srv.config.record))
    srv.proxy.policy_engine = _Gate(str(TINY), fail=True)
    r = _post(srv, "/v1/messages", ANTH, key=token("f"))
    assert (
        r.status_code == 529
        and r.json()["error"]["type"] == "overloaded_error"
        and r.headers["retry-after"]
    )
    r = _post(srv, "/v1/chat/completions", CHAT, key=token("f"))
    assert r.status_code == 503 and "GPU fell over" in r.json()["error"]["message"]
    assert len(list(read_calls(srv.config.record))) == len(recorded)
    assert any(c.policy == {"name": "gate", "version": 3} for c in recorded)


def test_admin_sessions_stats_and_routes(tmp_path, make_server):
    """Routes send model names to engines; admin tags land in records; a closed session gets 401."""
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"text": "from the frozen model"}) + "\n")
    srv = make_server(["from the policy"], routes=(("claude-haiku*", f"scripted:{other}"),))
    assert _post(srv, "/admin/sessions/r1", {"tags": {"task": "t9"}}).status_code == 401
    assert _post(srv, "/admin/sessions/r1", {"tags": {"task": "t9"}}, **ADMIN_H).json()["tags"] == {
        "task": "t9"
    }
    a = _post(
        srv, "/v1/messages", {**ANTH, "model": "claude-haiku-4-5"}, key=token("r1", harness="cc")
    )
    b = _post(
        srv, "/v1/messages", {**ANTH, "model": "claude-opus-4"}, key=token("r1", harness="cc")
    )
    assert a.json()["content"][0]["text"] == "from the frozen model"
    assert b.json()["content"][0]["text"] == "from the policy"
    ca, cb = read_calls(srv.config.record)
    assert (
        ca.engine == f"scripted:{other}"
        and ca.model == "claude-haiku-4-5"
        and ca.tags == {"task": "t9"}
    )
    stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    assert stats["calls_recorded"] == 2 and stats["records"] == 2
    assert _post(srv, "/admin/sessions/r1/close", {}, **ADMIN_H).json()["calls"] == 2
    assert _post(srv, "/v1/messages", ANTH, key=token("r1")).status_code == 401
    assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == "policy"
    assert httpx.get(srv.url + "/healthz").json()["ok"] is True
    assert httpx.get(srv.url + "/v1/models/claude-opus-4-1").json()["id"] == "claude-opus-4-1"
    r = _post(
        srv,
        "/v1/messages/count_tokens",
        {"model": "x", "messages": [{"role": "user", "content": "hi"}]},
        key=token("r2"),
    )
    assert r.json()["input_tokens"] > 0


@pytest.mark.slow
def test_policy_reload_keeps_in_flight_requests_on_old_weights(tmp_path):
    """POST /admin/policy swaps weights: a stream in flight finishes and is recorded on the old
    version; the next call is recorded with the new version and the new weights' logprobs."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    new_dir = tmp_path / "v1"
    shutil.copytree(TINY, new_dir)
    m = AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    m.save_pretrained(str(new_dir))
    cfg = ProxyConfig(
        engine=f"transformers:{TINY}",
        secret=SECRET,
        admin_token=ADMIN,
        record=str(tmp_path / "calls.jsonl"),
        max_tokens_cap=1500,
    )
    with ProxyServer(cfg) as srv, httpx.Client(base_url=srv.url, timeout=120) as h:
        # ignore_eos: the stream decodes all 1500 tokens (seconds), whatever it samples, so it is
        # still running when the reload (~40 ms) returns; without it, P(eos within 40) ~ 1.5%
        body = {**CHAT, "max_tokens": 1500, "stream": True, "ignore_eos": True}
        hdr = {"authorization": f"Bearer {token('rl')}"}
        with h.stream("POST", "/v1/chat/completions", json=body, headers=hdr) as s:
            lines = s.iter_lines()
            next(lines)
            r = h.post(
                "/admin/policy",
                headers=ADMIN_H,
                json={
                    "schema": "claw.policy/v1",
                    "name": "tiny",
                    "version": 1,
                    "path": str(new_dir),
                },
            )
            assert r.status_code == 200 and r.json()["policy"] == {"name": "tiny", "version": 1}
            reloaded_at = time.time()
            rest = list(lines)
        assert rest[-2] == "data: [DONE]" or rest[-1] == "data: [DONE]"
        bad = h.post(
            "/admin/policy",
            headers=ADMIN_H,
            json={"schema": "claw.policy/v1", "name": "x", "path": "p"},
        )
        assert bad.status_code == 400 and "version" in bad.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}, headers=hdr)
        assert r.status_code == 200
    old, new = read_calls(cfg.record)
    assert old.policy == {"name": "policy", "version": 0} and len(old.completion_ids) == 1500
    assert old.ended_at > reloaded_at  # it really was in flight during the reload
    assert new.policy == {"name": "tiny", "version": 1}
    ids = torch.tensor([new.prompt_ids + new.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(m(input_ids=ids).logits[0].float(), -1)
    n = len(new.prompt_ids)
    want = [float(logp[n - 1 + i, t]) for i, t in enumerate(new.completion_ids)]
    assert max(abs(a - b) for a, b in zip(want, new.completion_logprobs, strict=True)) < 1e-4


class _Flaky(Engine):
    """Sends one token, then fails (or hangs when `hang`)."""

    spec = "flaky"

    def __init__(self, tokenizer_dir, hang=False):
        super().__init__()
        self.tokenizer_dir = tokenizer_dir
        self.hang = hang

    def generate(self, req):
        gen = Generation()
        gen.put_nowait("policy", {"name": "flaky", "version": 0})
        gen.put_nowait("tokens", [(30, -0.1)])
        if not self.hang:  # right after the first token: no race with the 0.5 s request timeout
            gen.put_nowait("error", EngineError("lost the GPU"))
        return gen


def test_engine_failure_mid_stream_and_timeout(make_server):
    """A stream whose engine fails mid-way ends with the API's error event; a generation that
    exceeds the request timeout gets 504; neither is recorded."""
    srv = make_server(request_timeout=0.5)
    srv.proxy.policy_engine = _Flaky(str(TINY))
    r = _post(srv, "/v1/messages", {**ANTH, "stream": True}, key=token("m"))
    assert r.status_code == 200
    assert (
        "event: message_start" in r.text and "event: error" in r.text and "lost the GPU" in r.text
    )
    assert "message_stop" not in r.text
    r = _post(srv, "/v1/chat/completions", {**CHAT, "stream": True}, key=token("m"))
    assert '"error"' in r.text and r.text.rstrip().endswith("data: [DONE]")
    srv.proxy.policy_engine = _Flaky(str(TINY), hang=True)
    r = _post(srv, "/v1/chat/completions", CHAT, key=token("m"))
    assert r.status_code == 504 and "did not finish within 0.5 s" in r.json()["error"]["message"]
    assert srv.proxy.writer.written == 0
    assert srv.proxy.sessions["m"].in_flight == 0


def test_prompt_over_the_context_is_refused_and_max_tokens_fit_the_context(make_server):
    """A prompt longer than the engine's context gets 400; otherwise max tokens shrink to fit."""
    srv = make_server(["a b c d e f g h i j k l m n o p q r s t u v w x y z"])
    n = len(srv.proxy.renderers[str(TINY)].render_full(api_chat.parse(CHAT)))
    srv.proxy.policy_engine.max_context = n + 4
    r = _post(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 100}, key=token("ctx"))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    srv.proxy.policy_engine.max_context = n
    r = _post(srv, "/v1/chat/completions", CHAT, key=token("ctx2"))
    assert r.status_code == 400 and f"the prompt has {n} tokens" in r.json()["error"]["message"]


def test_scripted_engine_policy_reload(make_server, tmp_path):
    """The scripted engine takes POST /admin/policy too: a script file swaps the answers."""
    srv = make_server(["old answer"])
    new = tmp_path / "v2.jsonl"
    new.write_text(json.dumps({"text": "new answer"}) + "\n")
    pol = {"schema": "claw.policy/v1", "name": "scripted", "version": 2, "path": str(new)}
    assert _post(srv, "/admin/policy", pol, **ADMIN_H).json()["policy"] == {
        "name": "scripted",
        "version": 2,
    }
    r = _post(srv, "/v1/messages", ANTH, key=token("sr"))
    assert r.json()["content"][0]["text"] == "new answer"
    (call,) = read_calls(srv.config.record)
    assert call.policy == {"name": "scripted", "version": 2}
    bad = _post(srv, "/admin/policy", {**pol, "path": str(tmp_path / "missing")}, **ADMIN_H)
    assert (
        bad.status_code == 400
        and "neither a script file nor a directory" in bad.json()["error"]["message"]
    )
