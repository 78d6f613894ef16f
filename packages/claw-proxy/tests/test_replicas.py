"""Engine replicas (issue 19): `--engine A --engine B` behind one proxy, against fake vLLM
servers on loopback ports (replica_testlib.FakeVLLM): sticky sessions, least-loaded placement,
a per-version cache salt, weight updates on every replica, and a replica that dies."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from claw_proxy import ConfigError, ProxyConfig, read_calls
from claw_proxy.cli import main
from claw_proxy.render import Renderer
from click.testing import CliRunner
from proxy_testlib import ADMIN, SECRET, TINY, token
from replica_testlib import FakeVLLM

R = Renderer(str(TINY))
ANSWER = R.encode("hello from a replica") + [R.eos_ids[0]]
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def fakes():
    """Start fake vLLM servers: fakes(n, **options) -> list of started FakeVLLM."""
    made: list[FakeVLLM] = []

    def start(n: int = 2, **kw) -> list[FakeVLLM]:
        out = [FakeVLLM(ANSWER, **kw).start() for _ in range(n)]
        made.extend(out)
        return out

    yield start
    for f in made:
        f.stop()


def _proxy(make_server, engines: list[FakeVLLM], **kw):
    return make_server(
        engine=f"vllm:{engines[0].url}",
        replicas=tuple(f"vllm:{e.url}" for e in engines[1:]),
        tokenizer=str(TINY),
        **kw,
    )


def _chat(srv, session: str, content: str = "hi", **kw) -> httpx.Response:
    return httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": content}], **kw},
        headers={"authorization": f"Bearer {token(session)}"},
        timeout=60,
    )


def test_sessions_stick_to_a_replica_and_new_ones_go_to_the_least_loaded(
    make_server, fakes, clients
):
    """Each session's calls all go to one replica (its record's engine says which); new
    sessions alternate while the load is even, and go to the idle replica while the other
    has a call in flight."""
    a, b = fakes(2, token_s=0.05)
    srv = _proxy(make_server, [a, b])
    for turn in range(2):
        for s in ("s0", "s1"):
            assert _chat(srv, s, f"turn {turn}").status_code == 200
    by_session: dict[str, set[str]] = {}
    for c in read_calls(srv.config.record):
        by_session.setdefault(c.session, set()).add(c.engine)
    assert by_session == {"s0": {f"vllm:{a.url}"}, "s1": {f"vllm:{b.url}"}}
    assert len(a.completions) == len(b.completions) == 2
    # a call of s0 in flight on A: the next new session goes to B (sessions are 1/1 here).
    # A's first token of it takes 2 s (s2 is placed within milliseconds), then A runs fast again
    a.token_s = 2.0
    busy = threading.Thread(target=_chat, args=(srv, "s0", "a long one"))
    busy.start()
    while len(a.completions) < 3:
        busy.join(0.01)
    assert _chat(srv, "s2").status_code == 200
    a.token_s = 0.0
    busy.join()
    assert len(b.completions) == 3 and len(a.completions) == 3
    health = httpx.get(srv.url + "/healthz").json()
    assert health["status"] == "ok" and [r["sessions"] for r in health["replicas"]] == [1, 2]


def test_cache_salt_follows_the_version_and_updates_reach_every_replica(make_server, fakes):
    """Calls carry cache_salt <policy>-v<version>; POST /admin/policy pauses, loads and resumes
    every replica and the version changes once all have it; a replica refusing the weights
    leaves the version where it was (502 naming it)."""
    a, b = fakes(2)
    srv = _proxy(make_server, [a, b])
    assert _chat(srv, "s0").status_code == 200 and _chat(srv, "s1").status_code == 200
    assert [c["cache_salt"] for c in a.completions + b.completions] == ["policy-v0"] * 2
    pol = {"schema": "claw.policy/v1", "name": "tiny", "version": 1, "path": str(TINY)}
    r = httpx.post(srv.url + "/admin/policy", json=pol, headers=ADMIN_H, timeout=60)
    assert r.status_code == 200 and r.json()["policy"] == {"name": "tiny", "version": 1}
    for f in (a, b):
        assert [p for p, _ in f.admin] == [
            "/pause",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
        ]
        assert f.weights == str(TINY) and f.version == "1"
    assert _chat(srv, "s0", "again").status_code == 200
    assert a.completions[-1]["cache_salt"] == "tiny-v1"
    assert list(read_calls(srv.config.record))[-1].policy == {"name": "tiny", "version": 1}
    b.fail_reload = True
    r = httpx.post(srv.url + "/admin/policy", json={**pol, "version": 2}, headers=ADMIN_H)
    assert r.status_code == 502 and b.url in r.json()["error"]["message"]
    assert httpx.get(srv.url + "/healthz").json()["policy"]["version"] == 1


def test_a_replica_dying_mid_answer_is_retried_once_and_nothing_is_lost(
    make_server, fakes, clients
):
    """Replica A dies after streaming 3 tokens: the harness's stream still gets the whole
    answer (B continues from the prompt plus those tokens), one record holds it, A's sessions
    move to B, /healthz says degraded; with B dead too, calls get 503 and /healthz down."""
    a, b = fakes(2)
    a.die_after_tokens = 3
    srv = _proxy(make_server, [a, b])
    client = clients.openai(srv, "s0")
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == "hello from a replica"
    (call,) = read_calls(srv.config.record)
    assert call.completion_ids == ANSWER and call.engine == f"vllm:{b.url}"
    assert b.completions[0]["prompt"] == call.prompt_ids + ANSWER[:3]
    assert b.completions[0]["max_tokens"] == call.sampling["max_tokens"] - 3
    health = httpx.get(srv.url + "/healthz").json()
    assert health["status"] == "degraded" and health["ok"] is True
    assert [r["up"] for r in health["replicas"]] == [False, True]
    assert health["retried_calls"] == 1 and "vLLM" in health["replicas"][0]["error"]
    assert _chat(srv, "s0", "more").status_code == 200  # s0 moved to B
    assert _chat(srv, "s1").status_code == 200
    assert httpx.get(srv.url + "/healthz").json()["moved_sessions"] == 1
    assert len(list(read_calls(srv.config.record))) == 3
    b.stop()
    r = _chat(srv, "s0", "and now")
    assert r.status_code == 503 and "every engine replica is down" in r.text
    down = httpx.get(srv.url + "/healthz")
    assert down.status_code == 503 and down.json()["status"] == "down"
    assert len(list(read_calls(srv.config.record))) == 3


def test_a_stopped_replica_is_found_at_the_next_call(make_server, fakes):
    """A replica gone between calls (connection refused): its session's next call is retried
    on the other replica and recorded once; calls already recorded stay."""
    a, b = fakes(2)
    srv = _proxy(make_server, [a, b])
    assert _chat(srv, "s0").status_code == 200 and _chat(srv, "s1").status_code == 200
    a.stop()
    r = _chat(srv, "s0", "again")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == (
        "hello from a replica"
    )
    calls = list(read_calls(srv.config.record))
    assert [(c.session, c.engine) for c in calls] == [
        ("s0", f"vllm:{a.url}"),
        ("s1", f"vllm:{b.url}"),
        ("s0", f"vllm:{b.url}"),
    ]


def test_random_routing_spreads_a_session(make_server, fakes):
    """--replica-routing random sends one session's calls to both replicas (the baseline the
    bench compares sticky routing with)."""
    a, b = fakes(2)
    srv = _proxy(make_server, [a, b], replica_routing="random")

    async def go() -> None:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            for k in range(12):
                r = await c.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"{k}"}]},
                    headers={"authorization": f"Bearer {token('s0')}"},
                )
                assert r.status_code == 200

    asyncio.run(go())
    assert a.completions and b.completions


def test_replica_configs_are_checked(tmp_path):
    """Passthrough endpoints cannot be replicas, an engine named twice is refused, and the
    CLI reads --engine (repeated) and --replicas-file (comments skipped) into the replicas."""
    with pytest.raises(ConfigError, match="cannot serve the policy"):
        ProxyConfig(engine="vllm:http://a", replicas=("passthrough:http://b",), secret=SECRET)
    with pytest.raises(ConfigError, match="named twice"):
        ProxyConfig(engine="vllm:http://a", replicas=("vllm:http://a",), secret=SECRET)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    listed = tmp_path / "replicas.txt"
    listed.write_text("# two replicas\nvllm:http://b  # the second\n\nvllm:http://a\n")
    args = ["serve", "--secret-file", str(secret), "--tokenizer", str(TINY), "--port", "0"]
    r = CliRunner().invoke(main, [*args, "--engine", "vllm:http://a", "--replicas-file", listed])
    assert r.exit_code != 0 and "named twice" in r.output
    r = CliRunner().invoke(main, [*args, "--engine", "vllm:http://a", "--engine", "passthrough:x"])
    assert r.exit_code != 0 and "cannot serve the policy" in r.output
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "--engine" in r.output
