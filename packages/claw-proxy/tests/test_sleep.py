"""vLLM sleep mode behind the proxy (one GPU box: the engine frees the GPU while the learner
trains): POST /admin/sleep, then /admin/policy (or /admin/wake) wakes the engines, against fake
vLLM servers that keep sleep state the way vLLM 0.32's dev routes do (/sleep, /wake_up?tags=,
/is_sleeping). A real vLLM sleeps only on CUDA / ROCm: its CPU build refuses
--enable-sleep-mode ("Sleep mode is not supported on current platform."), see docs."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch.distributed as dist
from claw_proxy import AdminClient, read_calls
from claw_proxy.render import Renderer
from proxy_testlib import ADMIN, TINY, token
from replica_testlib import FakeVLLM
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

R = Renderer(str(TINY))
ANSWER = R.encode("awake again") + [R.eos_ids[0]]
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
TAGS = {"weights", "kv_cache"}


class SleepyVLLM(FakeVLLM):
    """A FakeVLLM with vLLM's sleep routes. `log` holds the admin routes (with their query) and
    each completion as ("completion", tags asleep, weights lost) in the order they came; a
    level-2 sleep loses the weights until a /collective_rpc loads new ones, which fails while
    the weights sleep (vLLM would write to unmapped memory). The reload routes are logged too. `fail_sleep`: /sleep answers 500
    and nothing sleeps (vLLM without --enable-sleep-mode); `fail_wake`: /wake_up answers 500."""

    def __init__(self, answer: list[int], **kw) -> None:
        self.asleep: set[str] = set()
        self.lost = False
        self.fail_sleep = self.fail_wake = False
        self.log: list[tuple] = []
        self.rpcs: list[dict] = []
        super().__init__(answer, **kw)

    def _app(self):
        app = super()._app()
        by_path = {r.path: r.endpoint for r in app.router.routes if isinstance(r, Route)}
        completions, admin = by_path["/v1/completions"], by_path["/collective_rpc"]

        async def completion(request: Request) -> Response:
            self.log.append(("completion", frozenset(self.asleep), self.lost))
            return await completions(request)

        async def rpc(request: Request) -> Response:
            self.log.append(("/collective_rpc",))
            body = await request.json()
            self.rpcs.append(body)
            if "weights" in self.asleep:
                return JSONResponse({"error": "weights asleep"}, status_code=500)
            self.lost = False
            if "transfer" in body["kwargs"]:
                self.version = str(body["kwargs"]["version"])
                return JSONResponse({})
            return await admin(request)

        async def sleep(request: Request) -> Response:
            self.log.append(("/sleep", str(request.query_params)))
            if self.fail_sleep:
                return JSONResponse({"error": "sleep mode is not enabled"}, status_code=500)
            self.asleep, level = set(TAGS), int(request.query_params["level"])
            self.lost = self.lost or level == 2
            return JSONResponse({"status": "sleeping", "level": level})

        async def wake_up(request: Request) -> Response:
            tags = request.query_params.getlist("tags")
            self.log.append(("/wake_up", *tags))
            if self.fail_wake:
                return JSONResponse({"error": "CUDA out of memory"}, status_code=500)
            self.asleep -= set(tags or TAGS)
            return JSONResponse({"status": "sleeping" if self.asleep else "awake"})

        async def is_sleeping(request: Request) -> Response:
            return JSONResponse({"is_sleeping": bool(self.asleep)})

        async def weight_info(request: Request) -> Response:
            return JSONResponse({"weight_version": self.version})

        def logged(path: str):
            async def route(request: Request) -> Response:
                self.log.append((path,))
                return await admin(request)

            return Route(path, route, methods=["POST"])

        reload_routes = ("/pause", "/reset_prefix_cache", "/update_weight_version", "/resume")
        app.router.routes[:0] = [
            *(logged(path) for path in reload_routes),
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/collective_rpc", rpc, methods=["POST"]),
            Route("/sleep", sleep, methods=["POST"]),
            Route("/wake_up", wake_up, methods=["POST"]),
            Route("/is_sleeping", is_sleeping),
            Route("/weight_info", weight_info),
        ]
        return app

    def admin_log(self) -> list[tuple]:
        return [e for e in self.log if e[0] != "completion"]


@pytest.fixture
def fakes():
    made: list[SleepyVLLM] = []

    def start(n: int = 1) -> list[SleepyVLLM]:
        made.extend(SleepyVLLM(ANSWER).start() for _ in range(n))
        return made[-n:]

    yield start
    for f in made:
        f.stop()


def _proxy(make_server, engines: list[SleepyVLLM]):
    return make_server(
        engine=f"vllm:{engines[0].url}",
        replicas=tuple(f"vllm:{e.url}" for e in engines[1:]),
        tokenizer=str(TINY),
    )


def _chat(srv, session: str, out: list | None = None) -> httpx.Response:
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {token(session)}"},
        timeout=60,
    )
    if out is not None:
        out.append(r)
    return r


def _held_chat(srv, session: str) -> tuple[threading.Thread, list]:
    """A call sent while the engines sleep; it must still be waiting 0.5 s later."""
    out: list = []
    t = threading.Thread(target=_chat, args=(srv, session, out))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not out
    return t, out


def _policy(version: int) -> dict:
    return {"schema": "claw.policy/v1", "name": "policy", "version": version, "path": str(TINY)}


def test_level_2_sleep_wakes_with_the_new_weights_in_order(make_server, fakes):
    """/admin/sleep level 2 sleeps the engine after its calls in flight; a call arriving then
    waits (not sent, not failed); /admin/wake is refused (the weights are gone); /admin/policy
    wakes the weights, loads the new ones, resets the prefix cache, sets the version, wakes the
    KV cache, and only then is the held call sent, answered and recorded on v1."""
    (f,) = fakes(1)
    srv = _proxy(make_server, [f])
    assert _chat(srv, "s0").status_code == 200
    r = httpx.post(srv.url + "/admin/sleep", json={"level": 2}, headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["sleeping"] == 2
    held, out = _held_chat(srv, "s1")
    r = httpx.post(srv.url + "/admin/wake", headers=ADMIN_H)
    assert r.status_code == 409 and "level 2" in r.json()["error"]["message"]
    assert held.is_alive()
    r = httpx.post(srv.url + "/admin/policy", json=_policy(1), headers=ADMIN_H, timeout=60)
    assert r.status_code == 200 and r.json()["policy"] == {"name": "policy", "version": 1}
    held.join(30)
    assert out[0].status_code == 200
    assert f.admin_log() == [
        ("/sleep", "level=2&mode=wait"),
        ("/wake_up", "weights"),
        ("/collective_rpc",),
        ("/reset_prefix_cache",),
        ("/update_weight_version",),
        ("/wake_up", "kv_cache"),
    ]
    assert f.version == "1" and f.weights == str(TINY)
    # two calls, each served awake with weights in place; the held one on the new version
    assert [e for e in f.log if e[0] == "completion"] == [("completion", frozenset(), False)] * 2
    assert [c.policy["version"] for c in read_calls(srv.config.record)] == [0, 1]


def test_level_1_sleep_wakes_with_its_own_weights(make_server, fakes):
    """AdminClient.sleep(1) then .wake(): the weights come back from CPU memory (no reload),
    the version stays, calls go on; a second wake is refused (409), a bad level is a 400, and
    an engine that cannot sleep (the scripted one) answers 501."""
    (f,) = fakes(1)
    srv = _proxy(make_server, [f])
    with AdminClient(srv.url, ADMIN) as admin:
        assert admin.sleep(1)["sleeping"] == 1
        held, out = _held_chat(srv, "s0")
        assert admin.wake()["policy"] == {"name": "policy", "version": 0}
        held.join(30)
        assert out[0].status_code == 200
        assert f.admin_log() == [
            ("/sleep", "level=1&mode=wait"),
            ("/wake_up", "weights"),
            ("/wake_up", "kv_cache"),
        ]
        assert f.log[-1] == ("completion", frozenset(), False)
    r = httpx.post(srv.url + "/admin/wake", headers=ADMIN_H)
    assert r.status_code == 409 and "not asleep" in r.text
    r = httpx.post(srv.url + "/admin/sleep", json={"level": 3}, headers=ADMIN_H)
    assert r.status_code == 400 and "level" in r.text
    scripted = make_server()
    r = httpx.post(scripted.url + "/admin/sleep", json={"level": 1}, headers=ADMIN_H)
    assert r.status_code == 501 and "cannot sleep" in r.text


def test_a_vllm_without_sleep_mode_says_so_and_keeps_serving(make_server, fakes):
    """A vLLM whose /sleep fails while it stays awake (no --enable-sleep-mode): the error
    names the flag, the engine is resumed and serves calls at once."""
    (f,) = fakes(1)
    f.fail_sleep = True
    srv = _proxy(make_server, [f])
    r = httpx.post(srv.url + "/admin/sleep", json={"level": 1}, headers=ADMIN_H)
    assert r.status_code == 503 and "--enable-sleep-mode" in r.json()["error"]["message"]
    assert f.admin_log() == [("/sleep", "level=1&mode=wait"), ("/resume",)]
    t0 = time.monotonic()
    assert _chat(srv, "s0").status_code == 200 and time.monotonic() - t0 < 5


def test_a_replica_that_does_not_wake_is_marked_down(make_server, fakes):
    """Two replicas sleep; B's wake fails: /admin/policy still answers v1 (A woke with it), B
    is marked down naming the failure, and every later call (the one held too) goes to A."""
    a, b = fakes(2)
    srv = _proxy(make_server, [a, b])
    with AdminClient(srv.url, ADMIN) as admin:
        admin.sleep(1)
        assert a.asleep == b.asleep == TAGS
        held, out = _held_chat(srv, "s0")
        b.fail_wake = True
        assert admin.reload(_policy(1))["policy"]["version"] == 1
    held.join(30)
    assert out[0].status_code == 200
    health = httpx.get(srv.url + "/healthz").json()
    assert health["status"] == "degraded"
    assert [r["up"] for r in health["replicas"]] == [True, False]
    assert "did not wake with v1" in health["replicas"][1]["error"]
    for s in ("s1", "s2", "s3"):
        assert _chat(srv, s).status_code == 200
    assert not [e for e in b.log if e[0] == "completion"]
    assert [c.policy["version"] for c in read_calls(srv.config.record)] == [1] * 4


def test_replicas_wake_over_the_learners_group_with_their_ranks(make_server, fakes):
    """A policy with ``transfer`` wakes two sleeping replicas: the proxy tells the learner's
    store the group size (3) and each replica receives at its own rank (1, 2) between the
    weights' and the KV cache's wake, then passes the /weight_info handshake."""
    a, b = fakes(2)
    srv = _proxy(make_server, [a, b])
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    bucket = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2]], "bytes": 16}
    transfer = {"method": "broadcast", "address": f"127.0.0.1:{store.port}",
                "backend": "gloo", "buckets": [bucket]}  # fmt: skip
    with AdminClient(srv.url, ADMIN) as admin:
        admin.sleep(2)
        assert admin.reload({**_policy(4), "transfer": transfer})["policy"]["version"] == 4
    assert store.get("claw/v4/world_size") == b"3"
    for f, rank in ((a, 1), (b, 2)):
        (rpc,) = f.rpcs
        assert rpc["method"] == "claw_receive_weights"
        assert (rpc["kwargs"]["rank"], rpc["kwargs"]["world_size"]) == (rank, 3)
        assert f.admin_log() == [
            ("/sleep", "level=2&mode=wait"),
            ("/wake_up", "weights"),
            ("/collective_rpc",),
            ("/reset_prefix_cache",),
            ("/update_weight_version",),
            ("/wake_up", "kv_cache"),
        ]
        assert f.version == "4" and not f.lost and not f.asleep
    assert _chat(srv, "s0").status_code == 200
