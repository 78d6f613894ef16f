"""An MoE policy's routing through engine replicas (issue 40): `--engine vllm:A --engine vllm:B`
records each call with the routing of the replica that answered it, also after a retry on the
other replica and when a stop sequence cuts the call.

The replicas are test_vllm_routing's fake vLLM 0.32 (whole answers with ``routed_experts``),
each in-process behind its own host name; replica B routes to other experts than A, so a
record shows which replica's rows it holds."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from claw_proxy import read_calls, read_routing
from claw_proxy._replicas import ReplicaSet
from claw_proxy.engines import Engine, Generation, GenRequest, VLLMEngine
from claw_proxy.errors import EngineError
from proxy_testlib import token
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from test_vllm_routing import ANSWER, CONFIG, MOE_FIXTURE, fake_vllm, moe_dir, npy_b64, vllm_rows

A, B = "http://a.test", "http://b.test"
MOE_COLUMNS = [0, 2]  # the fake's layer 1 is dense: the record keeps layers 0 and 2


def b_rows(t: int) -> np.ndarray:
    """Replica B's routing of t tokens as vLLM sends it: A's experts shifted by 1 (mod 8) in
    the MoE layers, so every row differs from A's."""
    a = vllm_rows(t)
    a[:, MOE_COLUMNS] = (a[:, MOE_COLUMNS] + 1) % 8
    return a


def routed_b(prompt: list[int], ids: list[int]) -> str:
    return npy_b64(b_rows(len(prompt) + len(ids) - 1))


class Hosts(httpx.AsyncBaseTransport):
    """One httpx transport over several in-process apps, picked by the request's host."""

    def __init__(self, apps: dict[str, object]) -> None:
        self.hosts = {httpx.URL(u).host: httpx.ASGITransport(app=app) for u, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.hosts[request.url.host].handle_async_request(request)


def dead(app):
    """`app` as a vLLM whose engine died: completions answer 500, /health 503."""

    async def fail(request):
        return JSONResponse({"error": "EngineDeadError"}, status_code=500)

    async def health(request):
        return Response(status_code=503)

    app.router.routes[2] = Route("/v1/completions", fail, methods=["POST"])
    app.router.routes.append(Route("/health", health))
    return app


@pytest.fixture
def moe_tok(tmp_path):
    """The policy's HF directory: the tiny MoE's tokenizer, the fake's 3-layer MoE config."""
    tok = tmp_path / "tok"
    shutil.copytree(MOE_FIXTURE, tok)
    (tok / "config.json").write_text(json.dumps(CONFIG))
    return tok


def replica_server(make_server, moe_tok, seen_a, seen_b, a_app=None, **kw):
    apps = {A: a_app or fake_vllm(seen_a), B: fake_vllm(seen_b, routed=routed_b)}
    return make_server(
        engine=f"vllm:{A}",
        replicas=(f"vllm:{B}",),
        tokenizer=str(moe_tok),
        sampling="honor",
        transport=Hosts(apps),
        **kw,
    )


def recorded(srv, n: int) -> list:
    """The server's call records once it has written `n` (a whole answer's call is recorded
    right after its last byte is handed to the connection, so a client may see it first)."""
    deadline = time.monotonic() + 5.0
    while True:
        calls = list(read_calls(srv.config.record)) if Path(srv.config.record).exists() else []
        if len(calls) >= n or time.monotonic() > deadline:
            return calls
        time.sleep(0.02)


def chat(clients, srv, session: str, **kw):
    return clients.openai(srv, session).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"hi from {session}"}], **kw
    )


def test_each_call_records_its_replicas_routing(make_server, clients, moe_tok):
    """Two sessions land on the two replicas; each call's stored rows are exactly what its
    replica returned (the MoE layers of every forwarded token), read back by read_routing."""
    seen_a, seen_b = [], []
    srv = replica_server(make_server, moe_tok, seen_a, seen_b)
    chat(clients, srv, "s1")
    chat(clients, srv, "s2")
    calls = {c.session: c for c in recorded(srv, 2)}
    assert len(seen_a) == len(seen_b) == 1 and not (seen_a[0]["stream"] or seen_b[0]["stream"])
    for session, spec, rows in (("s1", A, vllm_rows), ("s2", B, b_rows)):
        call = calls[session]
        n = len(call.prompt_ids) + len(call.completion_ids) - 1
        assert call.engine == f"vllm:{spec}" and call.completion_ids == ANSWER
        assert call.routing["experts"] == 8 and call.routing["dtype"] == "uint8"
        assert np.array_equal(read_routing(srv.config.record, call), rows(n)[:, MOE_COLUMNS])
    assert srv.proxy.stats["routing_calls"] == 2 and srv.proxy.stats["routing_missing"] == 0


def test_a_dead_replicas_call_is_retried_with_the_other_replicas_rows(
    make_server, clients, moe_tok
):
    """Replica A's engine dies on the call (500, /health 503): the call is retried on B, and
    the record holds B's rows for the whole call."""
    seen_b: list = []
    srv = replica_server(make_server, moe_tok, [], seen_b, a_app=dead(fake_vllm([])))
    chat(clients, srv, "s1")
    (call,) = recorded(srv, 1)
    n = len(call.prompt_ids) + len(call.completion_ids) - 1
    assert call.engine == f"vllm:{B}" and seen_b[0]["prompt"] == call.prompt_ids
    assert np.array_equal(read_routing(srv.config.record, call), b_rows(n)[:, MOE_COLUMNS])
    health = srv.proxy.policy_engine.health()
    assert health["retried_calls"] == 1 and health["status"] == "degraded"


class DiesMidAnswer(Engine):
    """A replica that passes on `tokens`, then dies (its routing never comes)."""

    def __init__(self, spec: str, tokens: list[int]) -> None:
        super().__init__()
        self.spec, self.tokens = spec, tokens

    def generate(self, req: GenRequest) -> Generation:
        gen = Generation()
        gen.routes = True
        gen.put_nowait("policy", dict(self.policy))
        gen.put_nowait("tokens", [(t, -0.5) for t in self.tokens])
        gen.put_nowait("error", EngineError("connection reset mid-answer"))
        return gen

    async def alive(self) -> bool:
        return False


def test_retry_after_sent_tokens_has_rows_for_the_whole_call(tmp_path):
    """A replica dies after passing on two tokens: the retry continues on the other replica
    from prompt + those tokens, and the relay's routing is that replica's, covering all
    P + C - 1 tokens of the call (its own prompt rows included)."""
    seen: list = []
    prompt, sent = [5, 6, 7], [21, 22]

    async def go():
        b = VLLMEngine(B, transport=httpx.ASGITransport(app=fake_vllm(seen, routed_b)))
        b.tokenizer_dir = str(moe_dir(tmp_path))
        a = DiesMidAnswer("vllm:http://a.test", sent)
        a.tokenizer_dir = b.tokenizer_dir
        replicas = ReplicaSet([a, b])
        gen = replicas.generate(GenRequest(prompt_ids=prompt, max_tokens=8))
        ids = [t async for chunk in gen.chunks() for t, _ in chunk]
        await b.aclose()
        return gen, ids, replicas

    gen, ids, replicas = asyncio.run(asyncio.wait_for(go(), 20))
    assert ids == [*sent, *ANSWER] and seen[0]["prompt"] == [*prompt, *sent]
    assert gen.routes and gen.experts == 8 and gen.engine_spec == f"vllm:{B}"
    n = len(prompt) + len(ids) - 1
    assert gen.routing.shape == (n, 2, 2)
    assert np.array_equal(gen.routing, b_rows(n)[:, MOE_COLUMNS])
    assert replicas.retries == 1 and replicas.up == [False, True]


def test_stop_sequence_gets_the_routing_without_waiting_for_the_deadline(
    make_server, clients, moe_tok
):
    """A stop sequence cancels the relay after the first tokens: the relay still passes on its
    replica's routing and ends, so the call is answered and recorded at once (not after the
    30 s deadline), with the rows of the tokens it kept."""
    srv = replica_server(make_server, moe_tok, [], [], request_timeout=30.0)
    t0 = time.monotonic()
    out = chat(clients, srv, "s1", stop=["*"])  # ANSWER is ')', '*', '+', eos
    elapsed = time.monotonic() - t0
    (call,) = recorded(srv, 1)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content == ")"
    assert call.completion_ids == ANSWER[:2] and elapsed < 5.0, elapsed
    n = len(call.prompt_ids) + len(call.completion_ids) - 1
    assert np.array_equal(read_routing(srv.config.record, call), vllm_rows(n)[:, MOE_COLUMNS])
    assert srv.proxy.stats["routing_missing"] == 0


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    """Two copies of a tiny Qwen3-MoE (3 decoder layers, the middle one dense), for two
    in-process transformers replicas; and the model, for the reference routing."""
    from moe_testlib import build_tiny_moe
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("moe")
    a = build_tiny_moe(d / "a")
    b = shutil.copytree(a, d / "b")
    return a, b, AutoModelForCausalLM.from_pretrained(a)


def test_stop_sequence_on_streaming_replicas_does_not_wait_for_the_deadline(make_server, moe_pair):
    """Transformers replicas stream token by token and put the routing at their end, after a
    stop sequence cancelled the relay: the relay stops its replica and still passes on the
    routing and its end, so the cut call is answered in well under its 30 s deadline, with
    the rows of the tokens it kept (a plain forward's routing of them)."""
    from moe_testlib import reference_routing

    a, b, model = moe_pair
    srv = make_server(
        engine=f"transformers:{a}",
        replicas=(f"transformers:{b}",),
        tokenizer=str(a),
        request_timeout=30.0,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "max_tokens": 24}
    body["seed"] = 7
    auth = {"authorization": f"Bearer {token('s1')}"}
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        full = h.post("/v1/chat/completions", json=body, headers=auth).json()
        text = full["choices"][0]["message"]["content"]
        t0 = time.monotonic()
        cut = h.post("/v1/chat/completions", json={**body, "stop": [text[3:5]]}, headers=auth)
        elapsed = time.monotonic() - t0
    assert cut.status_code == 200 and elapsed < 5.0, elapsed
    calls = recorded(srv, 2)
    assert len(calls) == 2 and len(calls[1].completion_ids) < len(calls[0].completion_ids)
    assert calls[0].engine == calls[1].engine == f"transformers:{a}"
    for c in calls:
        ids = list(c.prompt_ids) + c.completion_ids[:-1]
        got = read_routing(srv.config.record, c)
        np.testing.assert_array_equal(got, reference_routing(model, ids))


def test_kept_sizes_pass_through_transformers_replicas(make_server, moe_pair):
    """The in-process engine's kept-set sizes (`completion_kept`) reach the record through a
    replica set as they do from one engine: a top_k 5 call records 4 for every token (no ties
    in float32 logits); a vLLM replica, which records none, would leave the field out."""
    a, b, _ = moe_pair
    srv = make_server(
        engine=f"transformers:{a}",
        replicas=(f"transformers:{b}",),
        tokenizer=str(a),
        sampling="honor",
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "max_tokens": 12}
    auth = {"authorization": f"Bearer {token('k1')}"}
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={**body, "seed": 3, "temperature": 0.9, "top_k": 5},
        headers=auth,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (call,) = recorded(srv, 1)
    assert call.completion_kept == [4] * len(call.completion_ids)
