"""The vllm:URL and passthrough:URL engines against fake in-process upstreams."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from claw_proxy import read_calls
from claw_proxy.render import Renderer
from proxy_testlib import ADMIN, TINY, token
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

R = Renderer(str(TINY))
ANSWER = R.encode("hello from vllm") + [R.eos_ids[0]]


RAW = [-0.1 * (k + 1) for k in range(len(ANSWER))]  # the fake's "raw" logprobs


def processed(temperature: float) -> list[float]:
    """The fake's --logprobs-mode processed_logprobs: its raw logprobs divided by T."""
    return [lp / temperature for lp in RAW]


def fake_vllm(seen: list, logprobs_mode: str | None = "raw_logprobs"):
    """Answers like vLLM's OpenAI server: /v1/completions with token-id prompts and
    return_token_ids, /server_info with its --logprobs-mode (None: no such route, as without
    VLLM_SERVER_DEV_MODE)."""

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def server_info(request):
        seen.append(("/server_info", dict(request.query_params), None))
        return JSONResponse({"vllm_config": {"model_config": {"logprobs_mode": logprobs_mode}}})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        assert all(isinstance(i, int) for i in body["prompt"]) and body["stream"] is True
        ids = ANSWER[: body["max_tokens"]]
        t = body["temperature"]
        lps = processed(t) if logprobs_mode == "processed_logprobs" and t > 0 else RAW
        lps = lps[: len(ids)]
        finish = "stop" if len(ids) == len(ANSWER) else "length"

        async def sse():
            # like vLLM: one chunk per token, then [DONE]; ids as logprob tokens under
            # return_tokens_as_token_ids, as token_ids (the first chunk also carrying the prompt
            # ids) under return_token_ids
            as_ids = body.get("return_tokens_as_token_ids")
            for k, (i, lp) in enumerate(zip(ids, lps, strict=True)):
                choice = {
                    "index": 0,
                    "text": "x",
                    "logprobs": {
                        "tokens": [f"token_id:{i}" if as_ids else R.tokenizer.decode([i])],
                        "token_logprobs": [lp],
                        "top_logprobs": [{}],
                        "text_offset": [0],
                    },
                    "finish_reason": finish if k == len(ids) - 1 else None,
                }
                if body.get("return_token_ids"):
                    choice["token_ids"] = [i]
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
    info = [Route("/server_info", server_info)] if logprobs_mode else []
    return Starlette(
        routes=[
            *info,
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
            *reload_routes,
        ]
    )


# settings that shape vLLM's sampled distribution, sent so generation_config defaults never apply
NEUTRAL = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def test_vllm_engine_token_in_token_out(make_server, clients, tmp_path):
    """Under --sampling honor the proxy sends prompt ids and the request's settings to a vLLM in
    processed_logprobs mode and records exactly the ids and (processed) logprobs it returned."""
    seen: list = []
    srv = make_server(
        engine="vllm:http://vllm.test",
        vllm_reload_method="claw_reload_weights",
        tokenizer=str(TINY),
        sampling="honor",
        transport=httpx.ASGITransport(app=fake_vllm(seen, "processed_logprobs")),
    )
    client = clients.openai(srv, "v1")
    r = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.5,
        top_p=0.9,
        seed=3,
        extra_body={"top_k": 7},
    )
    assert r.choices[0].message.content == "hello from vllm"
    assert seen.pop(0) == ("/server_info", {"config_format": "json"}, None)
    (call,) = read_calls(srv.config.record)
    assert call.prompt_ids == seen[0]["prompt"] and call.completion_ids == ANSWER
    assert call.completion_logprobs == processed(0.5)
    sent = {k: seen[0][k] for k in ("temperature", "top_p", "top_k", *NEUTRAL)}
    assert sent == {"temperature": 0.5, "top_p": 0.9, "top_k": 7, **NEUTRAL}
    assert seen[0]["model"] == "tiny" and seen[0]["seed"] == 3
    assert seen[0]["return_tokens_as_token_ids"] is True and seen[0]["logprobs"] == 1
    assert "return_token_ids" not in seen[0]  # vLLM would echo the prompt ids back
    assert seen[0]["ignore_eos"] is False and seen[0]["stop_token_ids"]
    assert call.engine == "vllm:http://vllm.test"
    assert call.sampling == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "forced": False,
        "max_tokens": seen[0]["max_tokens"],
        "seed": 3,
    }
    # a LoRA adapter directory is loaded as the new policy
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    h = {"authorization": f"Bearer {ADMIN}"}
    pol = {"schema": "claw.policy/v1", "name": "tiny", "version": 2, "path": str(adapter)}
    assert httpx.post(srv.url + "/admin/policy", json=pol, headers=h).status_code == 200
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "again"}],
        extra_body={"ignore_eos": True},
    )
    assert (
        seen[1] == {"lora_name": "tiny-v2", "lora_path": str(adapter)}
        and seen[2]["model"] == "tiny-v2"
    )
    assert seen[2]["ignore_eos"] is True and seen[2]["stop_token_ids"] == []
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


def test_vllm_force_sends_neutral_settings_and_records_raw_logprobs(make_server, clients):
    """Under the default --sampling force, a request at T 0.5 / top_p 0.9 / top_k 7 reaches vLLM at
    T 1, top_p 1, top_k 0 and is recorded so (forced), with vLLM's raw logprobs."""
    seen: list = []
    srv = make_server(
        engine="vllm:http://vllm.test",
        tokenizer=str(TINY),
        transport=httpx.ASGITransport(app=fake_vllm(seen, "raw_logprobs")),
    )
    client = clients.openai(srv, "f1")
    for extra in ({"temperature": 0.5, "top_p": 0.9, "top_k": 7}, {"temperature": 1.0}):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], extra_body=extra
        )
    bodies = [b for b in seen if isinstance(b, dict)]
    for body in bodies:
        sent = {k: body[k] for k in ("temperature", "top_p", "top_k", *NEUTRAL)}
        assert sent == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **NEUTRAL}
    a, b = read_calls(srv.config.record)
    assert a.completion_logprobs == RAW and b.completion_logprobs == RAW
    got = [(c.sampling["temperature"], c.sampling["top_k"], c.sampling["forced"]) for c in (a, b)]
    assert got == [(1.0, 0, True), (1.0, 0, False)]  # b asked for exactly what force samples with


def test_vllm_honor_greedy_records_zero_logprobs(make_server, clients):
    """A greedy call (temperature 0) under honor is recorded with logprob 0.0 per token (a point
    mass), whatever vLLM reports for it."""
    seen: list = []
    srv = make_server(
        engine="vllm:http://vllm.test",
        tokenizer=str(TINY),
        sampling="honor",
        transport=httpx.ASGITransport(app=fake_vllm(seen, "processed_logprobs")),
    )
    clients.openai(srv, "g1").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], temperature=0.0, top_p=0.5
    )
    (call,) = read_calls(srv.config.record)
    assert seen[-1]["temperature"] == 0.0 and seen[-1]["top_p"] == 1.0
    assert call.completion_logprobs == [0.0] * len(ANSWER)
    assert call.sampling["temperature"] == 0.0 and call.sampling["top_p"] == 1.0


@pytest.mark.parametrize("mode", ["raw_logprobs", None, "processed_logits"])
def test_vllm_honor_refuses_a_vllm_without_processed_logprobs(make_server, clients, mode):
    """Under honor, a vLLM whose logprobs are not those of the sampled distribution (raw mode, a
    mode that cannot be read, logits) is refused: the preflight of `serve` raises and each
    request gets a 500 naming --logprobs-mode processed_logprobs; nothing is recorded."""
    import asyncio

    import openai
    from claw_proxy.errors import ConfigError

    seen: list = []
    srv = make_server(
        engine="vllm:http://vllm.test",
        tokenizer=str(TINY),
        sampling="honor",
        transport=httpx.ASGITransport(app=fake_vllm(seen, mode)),
    )
    engine = srv.proxy.policy_engine
    with pytest.raises(ConfigError, match="--logprobs-mode processed_logprobs"):
        asyncio.run(engine.preflight())
    with pytest.raises(openai.InternalServerError, match="--logprobs-mode processed_logprobs"):
        clients.openai(srv, "r1").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], temperature=0.6
        )
    assert not [b for b in seen if isinstance(b, dict)]  # no completion was asked for
    assert not Path(srv.config.record).exists() or not list(read_calls(srv.config.record))


def test_vllm_force_accepts_raw_or_unreadable_logprobs_mode(make_server):
    """Under force, raw_logprobs (vLLM's default) and an unreadable mode pass the preflight: at
    T 1 with no truncation the raw logprobs are those of the sampled distribution."""
    import asyncio

    for mode in ("raw_logprobs", None):
        srv = make_server(
            engine="vllm:http://vllm.test",
            tokenizer=str(TINY),
            transport=httpx.ASGITransport(app=fake_vllm([], mode)),
        )
        engine = srv.proxy.policy_engine
        asyncio.run(engine.preflight())
        assert engine.logprobs_mode == mode


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
    # the sampling recorded is what was sent upstream, unchanged by --sampling force (the default)
    assert a.sampling == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "forced": False,
        "seed": None,
    }
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.3,
        top_p=0.5,
        extra_body={"ignore_eos": True},
    )
    assert (seen[-1][1]["temperature"], seen[-1][1]["top_p"]) == (0.3, 0.5)
    assert seen[-1][1]["ignore_eos"] is True  # forwarded as sent
    c = list(read_calls(srv.config.record))[-1]
    assert (c.sampling["temperature"], c.sampling["top_p"], c.sampling["forced"]) == (
        0.3,
        0.5,
        False,
    )
    assert c.sampling["ignore_eos"] is True
    assert all(
        token("p1") not in json.dumps(h) for h, _ in seen
    )  # the session token is never forwarded


def test_vllm_sampled_ids_read_from_logprob_tokens():
    """Under return_tokens_as_token_ids vLLM names each sampled token 'token_id:N'; anything
    else is refused with the reason, never read as a wrong id."""
    from claw_proxy.engines import _token_ids
    from claw_proxy.errors import EngineError

    assert _token_ids(["token_id:5", "token_id:151645"]) == [5, 151645]
    with pytest.raises(EngineError, match="token_id:N"):
        _token_ids(["hello"])
