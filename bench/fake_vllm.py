"""A zero-latency fake of vLLM's OpenAI server for the proxy benchmarks (aiohttp, uvloop when
installed), answering as vLLM 0.32 does:

- ``POST /v1/completions`` streamed, one chunk per sampled token, each chunk with ``text``,
  ``logprobs`` {text_offset, token_logprobs, tokens, top_logprobs} and ``finish_reason`` /
  ``stop_reason``; ``tokens`` are ``token_id:N`` under ``return_tokens_as_token_ids``, and
  under ``return_token_ids`` each chunk carries ``token_ids`` and the first one the whole
  ``prompt_token_ids`` (vLLM's echo);
- ``POST /v1/chat/completions`` (stream or not): a fixed answer, for passthrough;
- ``GET /v1/models``, ``GET /server_info`` (``--logprobs-mode raw_logprobs``), ``GET /healthz``.

Run: python bench/fake_vllm.py PORT ANSWER_IDS_JSON ANSWER_TEXT
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web


def app(answer: list[int], pieces: list[str], text: str) -> web.Application:
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def server_info(request):
        return web.json_response(
            {"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}}
        )

    async def health(request):
        return web.Response(text="ok")

    async def completions(request):
        body = json.loads(await request.read())
        prompt = body["prompt"]
        as_ids = body.get("return_tokens_as_token_ids")
        with_ids = body.get("return_token_ids")
        ids = answer[: body["max_tokens"]]
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        created = int(time.time())
        offset = 0
        for k, (i, piece) in enumerate(zip(ids, pieces, strict=False)):
            tok = f"token_id:{i}" if as_ids else piece
            last = k == len(ids) - 1
            choice: dict = {
                "index": 0,
                "text": piece,
                "logprobs": {
                    "text_offset": [offset],
                    "token_logprobs": [-0.5],
                    "tokens": [tok],
                    "top_logprobs": [{tok: -0.5}],
                },
                "finish_reason": ("stop" if len(ids) == len(answer) else "length")
                if last
                else None,
                "stop_reason": None,
            }
            offset += len(piece)
            if with_ids:
                choice["token_ids"] = [i]
                if k == 0:
                    choice["prompt_token_ids"] = prompt
            chunk = {
                "id": "cmpl-bench",
                "object": "text_completion",
                "created": created,
                "model": body["model"],
                "choices": [choice],
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def chat(request):
        body = json.loads(await request.read())
        base = {"id": "chatcmpl-bench", "created": int(time.time()), "model": body.get("model")}
        usage = {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": text}
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for delta, finish in (
            ({"role": "assistant", "content": ""}, None),
            ({"content": text}, None),
            ({}, "stop"),
        ):
            chunk = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    a = web.Application(client_max_size=1 << 30)
    a.router.add_get("/v1/models", models)
    a.router.add_get("/server_info", server_info)
    a.router.add_get("/healthz", health)
    a.router.add_post("/v1/completions", completions)
    a.router.add_post("/v1/chat/completions", chat)
    return a


def main() -> None:
    port, answer, text = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    pieces = json.loads(sys.argv[4]) if len(sys.argv) > 4 else [""] * len(answer)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(app(answer, pieces, text), host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    main()
