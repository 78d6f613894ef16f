"""Shared fixtures: servers with the scripted and transformers engines, and clients (the tiny
model path, the secret and the other helpers live in proxy_testlib.py)."""

from __future__ import annotations

import pytest
from claw_proxy import ProxyConfig, ProxyServer
from proxy_testlib import (
    ADMIN,
    SECRET,
    TINY,
    token,
    write_script,
)


@pytest.fixture
def make_server(tmp_path):
    """Start ProxyServers with a config (defaults: scripted engine, records in tmp_path)."""
    servers = []

    def make(script: list[str] | None = None, **kw) -> ProxyServer:
        if "engine" not in kw:
            kw["engine"] = (
                f"scripted:{write_script(tmp_path / f'script{len(servers)}.jsonl', script or ['hello'])}"
            )
            kw.setdefault("tokenizer", str(TINY))
        kw.setdefault("secret", SECRET)
        kw.setdefault("admin_token", ADMIN)
        kw.setdefault("record", str(tmp_path / "calls.jsonl"))
        transport = kw.pop("transport", None)
        srv = ProxyServer(ProxyConfig(**kw), transport=transport).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """One transformers-engine server on the tiny model for a whole test module, honouring the
    requests' sampling settings (tests ask for greedy answers)."""
    d = tmp_path_factory.mktemp("tiny")
    cfg = ProxyConfig(
        engine=f"transformers:{TINY}",
        sampling="honor",
        secret=SECRET,
        admin_token=ADMIN,
        record=str(d / "calls.jsonl"),
        max_tokens_cap=48,
        default_max_tokens=24,
        record_bodies=True,
    )
    srv = ProxyServer(cfg).start()
    yield srv
    srv.stop()


@pytest.fixture
def clients():
    """SDK clients with session tokens, closed after the test: clients.openai(srv, session, **tags)."""
    import types

    import anthropic
    import openai

    made = []

    def oa(srv, session="s1", **tags):
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=token(session, **tags), max_retries=0)
        made.append(c)
        return c

    def an(srv, session="s1", **tags):
        c = anthropic.Anthropic(base_url=srv.url, api_key=token(session, **tags), max_retries=0)
        made.append(c)
        return c

    yield types.SimpleNamespace(openai=oa, anthropic=an)
    for c in made:
        c.close()
