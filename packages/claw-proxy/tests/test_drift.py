"""The boundary drift check (O(new tokens)) against the full re-render, on real harness
requests replayed turn by turn, and on the drift shapes it must see."""

from __future__ import annotations

import json

import pytest
from claw_proxy import api_anthropic, api_chat, api_responses
from claw_proxy.messages import Answer, ChatRequest, Message
from claw_proxy.render import PrefixCache, Renderer
from proxy_testlib import HARNESS_REQUESTS, TINY

_API = {
    "/v1/messages": api_anthropic,
    "/v1/chat/completions": api_chat,
    "/v1/responses": api_responses,
}


@pytest.fixture(scope="module")
def renderer():
    return Renderer(str(TINY))


def _answer(m: Message) -> Answer:
    return Answer(
        text=m.content,
        reasoning="",
        tool_calls=m.tool_calls,
        finish_reason="tool_calls" if m.tool_calls else "stop",
        prompt_tokens=0,
        completion_tokens=0,
    )


def _replay(renderer, req: ChatRequest, sampled) -> list[tuple]:
    """Replay `req` turn by turn through a boundary cache and a full cache, the policy having
    sampled `sampled(message)` for each assistant message; (boundary, full) verdicts."""
    caches = {
        mode: PrefixCache(renderer, drift_check_tokens=1 << 30, drift_check=mode)
        for mode in ("boundary", "full")
    }
    msgs = req.messages
    cuts = [
        i for i, m in enumerate(msgs) if m.role == "assistant" and msgs[i - 1].role != "assistant"
    ]
    verdicts = []
    for n, cut in enumerate([*cuts, len(msgs)]):
        turn = ChatRequest(api=req.api, model=req.model, messages=msgs[:cut], tools=req.tools)
        got = {}
        for mode, cache in caches.items():
            r = cache.render("s", turn)
            got[mode] = (r.fresh_render_matches, r.drift_check, r.parent_call is not None)
            if cut < len(msgs):
                m = msgs[cut]
                cache.remember("s", f"c{n}", r, _answer(m), sampled(m))
        if got["full"][2]:  # built by reuse
            assert got["boundary"][1] == "boundary" and got["full"][1] == "full"
            verdicts.append((got["boundary"][0], got["full"][0]))
    return verdicts


def _requests():
    for path in sorted(HARNESS_REQUESTS.glob("*.json")):
        d = json.loads(path.read_text())
        req = _API[d["path"].split("?")[0]].parse(d["body"])
        if any(m.role == "assistant" for m in req.messages[1:]):
            yield path.stem, req


def test_boundary_agrees_with_full_on_harness_requests(renderer):
    """On every captured multi-turn harness request, replayed turn by turn, the boundary check
    gives the full re-render's verdict: no drift when the policy sampled what the template
    writes, drift when it sampled trailing whitespace the harness stripped."""

    def tool_calls(m):
        return [(c.name, c.arguments) for c in m.tool_calls]

    def exact(m):
        return renderer.render_answer(m.content, tool_calls(m))

    def spaced(m):
        return renderer.render_answer(m.content + " \n", tool_calls(m))

    reused = 0
    for name, req in _requests():
        for sampled, want in ((exact, True), (spaced, False)):
            verdicts = _replay(renderer, req, sampled)
            assert verdicts, name
            for boundary, full in verdicts:
                assert boundary == full == want, (name, want)
            reused += len(verdicts)
    assert reused >= 8  # four captured requests carry earlier turns


def test_boundary_sees_a_token_merged_across_the_join(renderer):
    """An answer the policy ended without eos (a length stop) followed by text that merges with
    its last token: the reused ids differ from a fresh tokenisation, and both checks say so."""
    base = [Message(role="user", content="count")]
    caches = {m: PrefixCache(renderer, drift_check=m) for m in ("boundary", "full")}
    verdicts = {}
    for mode, cache in caches.items():
        r = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=tuple(base)))
        # sampled "ab" as two tokens: a re-render tokenises the text "ab" as it likes
        sampled = renderer.encode("a") + renderer.encode("b") + [renderer.tokenizer.eos_token_id]
        cache.remember("s", "c0", r, _answer(Message(role="assistant", content="ab")), sampled)
        nxt = (*base, Message(role="assistant", content="ab"), Message(role="user", content="go"))
        r2 = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=nxt))
        assert r2.parent_call == "c0"
        verdicts[mode] = r2.fresh_render_matches
    merged = renderer.encode("ab") != renderer.encode("a") + renderer.encode("b")
    assert verdicts == {"boundary": not merged, "full": not merged}


def test_full_rerender_every_nth_reuse(renderer):
    """--drift-full-every N: in boundary mode every Nth reused prompt is re-rendered in full."""
    cache = PrefixCache(renderer, drift_check="boundary", drift_full_every=2)
    msgs: list[Message] = [Message(role="user", content="start")]
    checks = []
    for turn in range(4):
        r = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=tuple(msgs)))
        if r.parent_call:
            checks.append(r.drift_check)
            assert r.fresh_render_matches is True
        answer = Message(role="assistant", content=f"reply {turn}")
        cache.remember("s", f"c{turn}", r, _answer(answer), renderer.render_answer(answer.content))
        msgs += [answer, Message(role="user", content=f"next {turn}")]
    assert checks == ["boundary", "full", "boundary"]


def test_drift_check_off_and_bad_mode(renderer):
    """`off` leaves the verdict unknown; an unknown mode is refused."""
    cache = PrefixCache(renderer, drift_check="off")
    first = ChatRequest(api="openai.chat", model="m", messages=(Message(role="user", content="a"),))
    r = cache.render("s", first)
    answer = Message(role="assistant", content="b")
    cache.remember("s", "c0", r, _answer(answer), renderer.render_answer("b"))
    r2 = cache.render(
        "s",
        ChatRequest(
            api="openai.chat",
            model="m",
            messages=(*first.messages, answer, Message(role="user", content="c")),
        ),
    )
    assert r2.parent_call == "c0" and r2.fresh_render_matches is None and r2.drift_check is None
    from claw_proxy.errors import ConfigError

    with pytest.raises(ConfigError, match="drift_check"):
        PrefixCache(renderer, drift_check="sometimes")


def test_boundary_falls_back_to_full_without_an_anchor(renderer, monkeypatch):
    """A template whose generation prompt does not start with an added token cannot anchor the
    boundary: such prompts get the full re-render (up to --drift-check-tokens) instead."""
    monkeypatch.setattr(renderer, "_boundary", None)
    cache = PrefixCache(renderer, drift_check="boundary")
    first = ChatRequest(api="openai.chat", model="m", messages=(Message(role="user", content="a"),))
    r = cache.render("s", first)
    answer = Message(role="assistant", content="b")
    cache.remember("s", "c0", r, _answer(answer), renderer.render_answer("b"))
    nxt = (*first.messages, answer, Message(role="user", content="c"))
    r2 = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=nxt))
    assert (r2.parent_call, r2.drift_check, r2.fresh_render_matches) == ("c0", "full", True)


def test_prefix_cache_memory_follows_distinct_tokens(renderer):
    """50 turns of one session hold about one copy of its tokens (each call's ids are a prefix
    of the next call's copy), and an earlier call stays reusable with its exact ids."""
    cache = PrefixCache(renderer)
    msgs: list[Message] = [Message(role="user", content="start " + "word " * 200)]
    history = []
    for turn in range(50):
        r = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=tuple(msgs)))
        assert r.fresh_render_matches is True
        answer = Message(role="assistant", content=f"reply {turn}")
        sampled = renderer.render_answer(answer.content)
        cache.remember("s", f"c{turn}", r, _answer(answer), sampled)
        history.append((tuple(msgs), r.prompt_ids + sampled))
        msgs += [answer, Message(role="user", content=f"next {turn} " + "word " * 60)]
    total = len(history[-1][1])
    assert cache.nbytes < 2 * (total * 8 + total * 7)  # about one copy, not one per turn
    # a request that extends call 40 (an edited later history) reuses call 40's exact ids
    old_msgs, old_ids = history[40]
    edit = (
        *old_msgs,
        Message(role="assistant", content="reply 40"),
        Message(role="user", content="x"),
    )
    r = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=edit))
    assert r.parent_call == "c40" and r.prompt_ids[: len(old_ids)] == old_ids
    assert r.fresh_render_matches is True
    cache.forget("s")
    assert cache.nbytes == 0


def _one_and_two_pass(renderer, req: ChatRequest, sampled, quick=None, **kw) -> list[tuple]:
    """Replay `req` turn by turn through a one-pass and a two-pass boundary cache; per call
    the (one-pass, two-pass) renderings as their recorded parts (prompt ids, their JSON, the
    `prefix` object). The one-pass cache tries `quick_render` first (as the server does),
    noting its answers in `quick`."""
    caches = [PrefixCache(renderer, **kw) for _ in range(2)]
    caches[1].one_pass = False
    quick = [] if quick is None else quick

    def one(session, turn):
        quick.append(caches[0].quick_render(session, turn))
        return quick[-1] or caches[0].render(session, turn)

    render = [one, caches[1].render]
    msgs = req.messages
    cuts = [
        i for i, m in enumerate(msgs) if m.role == "assistant" and msgs[i - 1].role != "assistant"
    ]
    out = []
    for n, cut in enumerate([*cuts, len(msgs)]):
        turn = ChatRequest(api=req.api, model=req.model, messages=msgs[:cut], tools=req.tools)
        got = []
        for cache, how in zip(caches, render, strict=True):
            r = how("s", turn)
            got.append((r.prompt_array.tolist(), r.prompt_json, r.prefix_record(), r.keys))
            if cut < len(msgs):
                cache.remember("s", f"c{n}", r, _answer(msgs[cut]), sampled(msgs[cut]))
        out.append(tuple(got))
    return out


def test_one_pass_boundary_gives_the_two_pass_records(renderer, monkeypatch):
    """The continuation taken from the boundary check's own tokenisation is exactly the
    two-pass rendering, on every captured harness request replayed turn by turn: with no drift
    (where the one pass is taken), with drift (trailing whitespace the harness stripped; an
    answer ended by an eos id the template does not write), and with full checks sampled."""
    taken = []
    real = renderer.boundary_continuation
    monkeypatch.setattr(
        renderer, "boundary_continuation", lambda *a: taken.append(real(*a)) or taken[-1]
    )

    def tool_calls(m):
        return [(c.name, c.arguments) for c in m.tool_calls]

    other_eos = [i for i in renderer.eos_ids if i != renderer.tokenizer.eos_token_id]
    shapes = {
        "exact": lambda m: renderer.render_answer(m.content, tool_calls(m)),
        "spaced": lambda m: renderer.render_answer(m.content + " \n", tool_calls(m)),
        "no-eos": lambda m: renderer.render_answer(m.content, tool_calls(m))[:-1],
    }
    if other_eos:
        shapes["other-eos"] = lambda m: [
            *renderer.render_answer(m.content, tool_calls(m))[:-1],
            other_eos[0],
        ]
    reused: dict[str, int] = {}
    quick: list = []
    for name, req in _requests():
        for shape, sampled in shapes.items():
            for kw in ({}, {"drift_full_every": 2}):
                for one, two in _one_and_two_pass(renderer, req, sampled, quick, **kw):
                    assert json.dumps(one) == json.dumps(two), (name, shape, kw)
                    if one[2]["parent_call"]:
                        reused[shape] = reused.get(shape, 0) + 1
                        if shape in ("exact", "spaced"):
                            want = shape == "exact"
                            assert one[2]["fresh_render_matches"] is want, (name, shape)
    assert reused["exact"] >= 8 and reused["spaced"] >= 8
    hits = [t for t in taken if t is not None]
    assert hits and len(hits) < len(taken)  # taken with no drift, refused with drift
    quick_hits = [r for r in quick if r is not None]
    assert quick_hits and len(quick_hits) < len(quick)  # declined: drift, a full check due


def test_one_pass_boundary_on_a_token_merged_across_the_join(renderer):
    """An answer ended without eos whose text merges with the next: both paths give the same
    prompt and verdict (the one pass does not apply without the eos split)."""
    base = [Message(role="user", content="count")]
    got = []
    for one_pass in (True, False):
        cache = PrefixCache(renderer)
        cache.one_pass = one_pass
        r = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=tuple(base)))
        sampled = renderer.encode("a") + renderer.encode("b")
        cache.remember("s", "c0", r, _answer(Message(role="assistant", content="ab")), sampled)
        nxt = (*base, Message(role="assistant", content="ab"), Message(role="user", content="go"))
        r2 = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=nxt))
        assert r2.parent_call == "c0"
        got.append((r2.prompt_array.tolist(), r2.prompt_json, r2.prefix_record()))
    assert got[0] == got[1]
