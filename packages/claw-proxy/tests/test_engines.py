"""The vllm:URL and passthrough:URL engines against fake in-process upstreams."""

from __future__ import annotations

import json

import httpx
from claw_proxy import read_calls
from claw_proxy.render import Renderer
from conftest import ADMIN, TINY, token
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

R = Renderer(str(TINY))
ANSWER = R.encode("hello from vllm") + [R.eos_ids[0]]


def fake_vllm(seen: list):
    """Answers like vLLM's OpenAI server: /v1/completions with token-id prompts and return_token_ids."""

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        assert all(isinstance(i, int) for i in body["prompt"]) and body["stream"] is True
        ids = ANSWER[: body["max_tokens"]]
        lps = [-0.1 * (k + 1) for k in range(len(ids))]
        finish = "stop" if len(ids) == len(ANSWER) else "length"

        async def sse():
            # like vLLM: one chunk per token (the first also carries the prompt ids), then [DONE]
            for k, (i, lp) in enumerate(zip(ids, lps, strict=True)):
                choice = {
                    "index": 0,
                    "text": "x",
                    "token_ids": [i],
                    "logprobs": {
                        "tokens": [str(i)],
                        "token_logprobs": [lp],
                        "top_logprobs": [{}],
                        "text_offset": [0],
                    },
                    "finish_reason": finish if k == len(ids) - 1 else None,
                }
                if k == 0:
                    choice["prompt_token_ids"] = body["prompt"]
                yield (
                    "data: "
                    + json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
                    + "\n\n"
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def load_lora(request):
        seen.append(await request.json())
        return JSONResponse({"ok": True})

    async def admin(request):
        body = await request.body()
        seen.append(
            (request.url.path, dict(request.query_params), json.loads(body) if body else None)
        )
        return JSONResponse({})

    reload_routes = [
        Route(p, admin, methods=["POST"])
        for p in (
            "/pause",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
        )
    ]
    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
            *reload_routes,
        ]
    )


def test_vllm_engine_token_in_token_out(make_server, clients, tmp_path):
    """The proxy sends prompt ids to vLLM and records exactly the ids and logprobs it returned."""
    seen: list = []
    srv = make_server(
        engine="vllm:http://vllm.test",
        vllm_reload_method="claw_reload_weights",
        tokenizer=str(TINY),
        transport=httpx.ASGITransport(app=fake_vllm(seen)),
    )
    client = clients.openai(srv, "v1")
    r = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.5,
        top_p=0.9,
        seed=3,
    )
    assert r.choices[0].message.content == "hello from vllm"
    (call,) = read_calls(srv.config.record)
    assert call.prompt_ids == seen[0]["prompt"] and call.completion_ids == ANSWER
    assert call.completion_logprobs == [-0.1 * (k + 1) for k in range(len(ANSWER))]
    assert seen[0]["model"] == "tiny" and seen[0]["temperature"] == 0.5 and seen[0]["top_p"] == 0.9
    assert seen[0]["seed"] == 3 and seen[0]["return_token_ids"] is True and seen[0]["logprobs"] == 1
    assert call.engine == "vllm:http://vllm.test" and call.sampling["temperature"] == 0.5
    # a LoRA adapter directory is loaded as the new policy
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    h = {"authorization": f"Bearer {ADMIN}"}
    pol = {"schema": "claw.policy/v1", "name": "tiny", "version": 2, "path": str(adapter)}
    assert httpx.post(srv.url + "/admin/policy", json=pol, headers=h).status_code == 200
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "again"}])
    assert (
        seen[1] == {"lora_name": "tiny-v2", "lora_path": str(adapter)}
        and seen[2]["model"] == "tiny-v2"
    )
    assert list(read_calls(srv.config.record))[-1].policy == {"name": "tiny", "version": 2}
    # an HF directory goes through vLLM's weight-reload routes, then requests use the base model
    del seen[:]
    full = {**pol, "version": 3, "path": str(TINY)}
    assert httpx.post(srv.url + "/admin/policy", json=full, headers=h).status_code == 200
    assert seen == [
        ("/pause", {"mode": "wait"}, None),
        (
            "/collective_rpc",
            {},
            {"method": "claw_reload_weights", "kwargs": {"weights_path": str(TINY)}},
        ),
        ("/reset_prefix_cache", {}, None),
        ("/update_weight_version", {}, {"new_version": "3"}),
        ("/resume", {}, None),
    ]
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "third"}])
    assert seen[-1]["model"] == "tiny"
    assert list(read_calls(srv.config.record))[-1].policy == {"name": "tiny", "version": 3}


def fake_openai(seen: list):
    async def chat(request):
        body = await request.json()
        seen.append((dict(request.headers), body))
        if body.get("stream"):

            async def gen():
                for piece in ("real ", "answer"):
                    yield (
                        "data: "
                        + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]})
                        + "\n\n"
                    )
                yield "data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "real answer"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_passthrough_forwards_and_records_text_only(make_server, clients):
    """passthrough: the request goes upstream with the upstream key, recorded as not trainable."""
    seen: list = []
    srv = make_server(
        engine="passthrough:http://upstream.test",
        upstream_api_key="sk-real",
        transport=httpx.ASGITransport(app=fake_openai(seen)),
    )
    client = clients.openai(srv, "p1")
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "real answer"
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "real answer"
    assert seen[0][0]["authorization"] == "Bearer sk-real"
    a, b = read_calls(srv.config.record)
    assert (
        not a.trainable
        and a.prompt_ids == []
        and a.response["choices"][0]["message"]["content"] == "real answer"
    )
    assert a.request["messages"][0]["content"] == "hi" and "real " in b.response["sse"]
    assert all(
        token("p1") not in json.dumps(h) for h, _ in seen
    )  # the session token is never forwarded
