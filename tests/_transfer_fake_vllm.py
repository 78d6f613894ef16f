"""A fake vLLM server process for the weight-transfer tests (tests/test_weight_transfer.py).

It is claw-proxy's test FakeVLLM (a fixed answer, the reload routes) whose ``/collective_rpc``
runs the claw worker extension's real receive (examples/gpu/claw_vllm_worker.py: join the
learner's gloo group, take every bucket) and whose ``/weight_info`` reports the version it was
told. ``--die-at-bucket N`` exits the process (kill -9 style) when bucket N arrives: a receiver
killed mid-transfer. Like vLLM (and unlike FakeVLLM, which streams every answer) it answers a
request with ``"stream": false`` in one JSON body. Writes its URL (whole: written aside, then
renamed) to ``--url-file``, the sums of the tensors it received to
``--received``.

    python tests/_transfer_fake_vllm.py --url-file u.txt --received r.json --answer 1,2,3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples" / "gpu"), str(ROOT / "packages" / "claw-proxy" / "tests")]

import claw_vllm_worker as worker  # noqa: E402
from replica_testlib import FakeVLLM  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402


class TransferFake(FakeVLLM):
    def __init__(self, answer: list[int], die_at: int | None, received: Path) -> None:
        self.die_at, self.received = die_at, received
        super().__init__(answer)

    def _receive(self, kw: dict) -> dict:
        group = worker.join(kw["transfer"], kw["version"], kw["rank"], kw["world_size"])
        sums = {}
        for i, pairs in enumerate(worker.buckets(kw["transfer"], group)):
            if i == self.die_at:
                os._exit(9)
            sums.update({name: float(t.double().sum()) for name, t in pairs})
        return sums

    def _app(self):
        app = super()._app()
        streamed = next(r.endpoint for r in app.router.routes if r.path == "/v1/completions")

        async def completions(request: Request) -> Response:
            # vLLM answers ``"stream": false`` with one JSON body, not an event stream: a proxy
            # that asks for whole answers must get one (FakeVLLM streams every answer)
            body = await request.json()
            if body.get("stream", False) or self.dead:
                return await streamed(request)  # the body stays cached on the request
            self.completions.append(body)
            ids = self.continuation(body["prompt"])[: body["max_tokens"]]
            finish = "stop" if ids and ids[-1] == self.answer[-1] else "length"
            logprobs = {
                "tokens": [f"token_id:{i}" for i in ids],
                "token_logprobs": [-0.25] * len(ids),
            }
            choice = {
                "index": 0,
                "text": "x" * len(ids),
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            return JSONResponse({"choices": [choice]})

        async def rpc(request: Request) -> JSONResponse:
            body = await request.json()
            self.admin.append(("/collective_rpc", body))
            sums = await asyncio.to_thread(self._receive, body["kwargs"])
            self.received.write_text(json.dumps(sums))
            return JSONResponse({"results": [{"tensors": len(sums)}]})

        async def weight_info(request: Request) -> JSONResponse:
            return JSONResponse({"weight_version": self.version})

        app.router.routes[:0] = [
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/collective_rpc", rpc, methods=["POST"]),
            Route("/weight_info", weight_info),
        ]
        return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url-file", type=Path, required=True)
    p.add_argument("--received", type=Path, required=True)
    p.add_argument("--answer", required=True)
    p.add_argument("--die-at-bucket", type=int, default=None)
    a = p.parse_args()
    answer = [int(x) for x in a.answer.split(",")]
    fake = TransferFake(answer, a.die_at_bucket, a.received).start()
    part = a.url_file.with_name(a.url_file.name + ".part")  # the test never reads half a URL
    part.write_text(fake.url)
    os.replace(part, a.url_file)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
