"""Limits that once had holes (token counting, oversize prompts, surrogates inside tool-call
arguments) and protocol gaps (a no-argument tool call streamed by a passthrough teacher)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from claw_proxy import read_calls
from claw_proxy.render import Renderer
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_testlib import ADMIN, TINY, token
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
R = Renderer(str(TINY))


def _post(srv, path: str, body: dict | bytes, session: str = "s1") -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"content-type": "application/json", "x-api-key": token(session)}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.post(path, content=raw, headers=h)


# --- lone surrogates inside tool-call arguments ---------------------------------------------

_ARGS = json.dumps({"path": "\ud800"}, ensure_ascii=True)  # '{"path": "\\ud800"}': valid JSON text


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "read", "arguments": _ARGS},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "x"},
                ],
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            "/v1/responses",
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c1", "name": "read", "arguments": _ARGS},
                    {"type": "function_call_output", "call_id": "c1", "output": "x"},
                ],
            },
            "input[1].arguments",
        ),
    ],
)
def test_lone_surrogate_inside_tool_call_arguments_gets_400(
    make_server, tmp_path, path, body, where
):
    """A tool call's `arguments` string whose JSON decodes to a lone surrogate is a 400 naming
    the field (it was a 500: the body passed the surrogate check, the decoded arguments did not
    encode); nothing is recorded."""
    srv = make_server()
    r = _post(srv, path, body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "lone UTF-16 surrogate" in message and where in message
    record = tmp_path / "calls.jsonl"
    assert not record.exists() or not list(read_calls(str(record)))


# --- a passthrough teacher's no-argument tool call --------------------------------------------


def _no_arg_teacher() -> Starlette:
    """An Anthropic upstream that streams a tool call without arguments the way the real API
    does: one input_json_delta whose partial_json is the empty string."""

    async def messages(request):
        events = [
            {"type": "message_start", "message": {"id": "m", "content": []}},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ""},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
            {"type": "message_stop"},
        ]

        async def gen():
            for e in events:
                yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


def test_passthrough_no_argument_tool_call_streamed_is_recorded_with_ids(make_server):
    """An empty `partial_json` is a call with `{}` input: the teacher's turn is recorded in the
    student's ids (it raised and was recorded without ids)."""
    srv = make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        student_ids=True,
        transport=httpx.ASGITransport(app=_no_arg_teacher()),
    )
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "stream": True,
        "tools": [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}],
        "messages": [{"role": "user", "content": "list"}],
    }
    r = _post(srv, "/v1/messages", body)
    assert r.status_code == 200 and '"partial_json": ""' in r.text
    (call,) = read_calls(srv.config.record)
    assert call.trainable and call.finish_reason == "tool_calls"
    assert call.completion_ids == R.render_answer("", [("ls", {})])
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/admin/stats", headers=ADMIN_H).json()["errors"] == 0


# --- count_tokens under the limits of a call; refusing oversize prompts before rendering ----


def _count_body(text: str) -> dict:
    return {"model": "claude-x", "messages": [{"role": "user", "content": text}]}


def _count(srv, text: str, session: str = "s1") -> httpx.Response:
    h = {"x-api-key": token(session), "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.post("/v1/messages/count_tokens", json=_count_body(text), headers=h)


def _session(srv, sid: str) -> dict:
    with httpx.Client(base_url=srv.url) as c:
        return c.get(f"/admin/sessions/{sid}", headers=ADMIN_H).json()


def test_count_tokens_takes_a_session_slot(make_server):
    """A count is a request of its session: past --session-concurrency it gets 429, and its
    slot is released after it (the counts ran outside any limit)."""
    srv = make_server(session_concurrency=2)
    _session(srv, "s1")  # the session exists
    srv.proxy.sessions["s1"].in_flight = 2  # two calls of s1 in flight
    r = _count(srv, "hello")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert "already has 2 requests in flight" in r.json()["error"]["message"]
    srv.proxy.sessions["s1"].in_flight = 0
    r = _count(srv, "hello")
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    assert _session(srv, "s1")["in_flight"] == 0


def test_count_tokens_over_max_prompt_tokens_gets_413(make_server):
    """A count whose rendered prompt is over --max-prompt-tokens is a 413, as a call is."""
    srv = make_server(max_prompt_tokens=60)
    assert _count(srv, "word " * 10).status_code == 200
    r = _count(srv, "word " * 100)  # ~100 tokens: under the text bound, over the limit
    assert r.status_code == 413, r.text
    assert "over this proxy's limit of 60" in r.json()["error"]["message"]
    assert _session(srv, "s1")["in_flight"] == 0


class _Counting:
    """Counts calls of a renderer's template and tokenizer (wrapped on the instance)."""

    def __init__(self, renderer) -> None:
        self.calls = 0
        for name in ("_template", "encode", "render_full"):
            inner = getattr(renderer, name)
            setattr(renderer, name, self._wrap(inner))

    def _wrap(self, inner):
        def counted(*args, **kw):
            self.calls += 1
            return inner(*args, **kw)

        return counted


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/v1/chat/completions"])
def test_prompt_proven_over_the_limit_is_refused_before_rendering(make_server, tmp_path, path):
    """When the message text alone proves the prompt over --max-prompt-tokens (characters /
    the tokenizer's longest token), the request gets 413 without the chat template or the
    tokenizer being run, and the session's slot is released."""
    srv = make_server(max_prompt_tokens=100)
    bound = srv.proxy.bounds[str(TINY)]
    assert bound.bytes_per_token == 26 and bound.roles == {"system", "user", "tool"}
    counter = _Counting(srv.proxy.renderers[str(TINY)])
    text = "x" * (26 * 100 + 1)  # at least 101 tokens, whatever the tokenizer makes of it
    if path.endswith("count_tokens"):
        r = _count(srv, text)
    else:
        r = _post(srv, path, {"model": "m", "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 413, r.text
    assert "at least 101 tokens (2601 characters of message text" in r.text
    assert counter.calls == 0
    assert _session(srv, "s1")["in_flight"] == 0
    assert not (tmp_path / "calls.jsonl").exists() or not list(read_calls(srv.config.record))


_LONGEST = max(R.tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False), key=len)
_PIECES = st.sampled_from(
    [
        _LONGEST,  # the worst case: each token covers the most characters it can
        R.tokenizer.convert_tokens_to_string([_LONGEST]),
        "<|im_end|>",
        "<think>",
        " ",
        "\n",
        "é",
        "\U0001d400",
        "word ",
    ]
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    texts=st.lists(
        st.one_of(st.text(max_size=200), st.lists(_PIECES, max_size=80).map("".join)),
        min_size=1,
        max_size=4,
    ),
    system=st.booleans(),
)
def test_prompt_bound_never_exceeds_the_rendered_token_count(texts, system):
    """The text bound is a lower bound: over random texts, the tokenizer's longest token
    repeated, added tokens written as text and non-ASCII characters, it never claims more
    tokens than the rendered prompt has (so it never gives a false 413)."""
    from claw_proxy import api_chat
    from claw_proxy._bound import PromptBound

    bound = PromptBound(R)
    roles = ["user", "tool"] * len(texts)
    msgs: list[dict] = [{"role": "system", "content": texts[0]}] if system else []
    for i, (text, role) in enumerate(zip(texts, roles, strict=False)):
        if role == "tool":
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
        else:
            msgs.append({"role": "user", "content": text})
    req = api_chat.parse({"model": "m", "messages": msgs})
    assert bound.at_least(req)[0] <= len(R.render_full(req))


def test_bound_rule_by_tokenizer_kind(tmp_path):
    """Normalisers that can shrink text scale the bound; one that can drop text, or a tokenizer
    that is not byte-level BPE, has no bound at all (every prompt is rendered)."""
    from claw_proxy._bound import _shrink, bytes_per_token
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert _shrink(None) == 1 and _shrink({"type": "NFC"}) == 3
    assert (
        _shrink({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})
        == 12
    )
    assert _shrink({"type": "Strip"}) is None and _shrink({"type": "BertNormalizer"}) is None
    assert bytes_per_token(R.tokenizer) == 26
    word = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    assert bytes_per_token(PreTrainedTokenizerFast(tokenizer_object=word)) is None


# --- reasoning in the Responses API; thinking switches -----------------------------------------

THOUGHT = "<think>let me see</think>"
ANSWER = THOUGHT + "The answer."


def _reasoning_count() -> int:
    """The sampled tokens that hold the reasoning: the scripted answer is tokenised whole, and
    `</think>` is an added token, so they are the ids of the reasoning part alone."""
    return len(R.encode(THOUGHT))


def test_responses_reasoning_item_and_tokens_non_streamed(make_server, clients):
    """A thinking answer gives a `reasoning` output item (reasoning_text content, empty summary)
    before the message, and usage.output_tokens_details.reasoning_tokens counts its tokens
    (the SDK parses both; chat completions report the same count)."""
    srv = make_server([ANSWER])
    r = clients.openai(srv).responses.create(model="m", input="hi")
    rs, msg = r.output
    assert rs.type == "reasoning" and rs.id.startswith("rs_") and rs.summary == []
    assert [(c.type, c.text) for c in rs.content] == [("reasoning_text", "let me see")]
    assert msg.type == "message" and r.output_text == "The answer."
    assert r.usage.output_tokens_details.reasoning_tokens == _reasoning_count() > 0
    assert r.usage.output_tokens == _reasoning_count() + len(R.encode("The answer.")) + 1
    chat = clients.openai(srv, "s2").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.usage.completion_tokens_details.reasoning_tokens == _reasoning_count()
    plain = make_server(["no thoughts"])
    r = clients.openai(plain, "s3").responses.create(model="m", input="hi")
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_responses_reasoning_streamed_matches_non_streamed(make_server, clients):
    """Streamed, the reasoning item is added, its reasoning_text deltas add up to the text, it
    is done before the message starts, and the completed response equals the non-streamed one
    (ids aside)."""
    srv = make_server([ANSWER])
    oa = clients.openai(srv)
    with oa.responses.create(model="m", input="hi", stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == "let me see"
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == "let me see" and done.output_index == 0
    final = events[-1].response
    assert events[-1].type == "response.completed"
    plain = oa.responses.create(model="m", input="hi")

    def shape(resp):
        out = resp.model_dump(exclude={"id", "created_at"})
        for item in out["output"]:
            item.pop("id")
        return out

    assert shape(final) == shape(plain)
    assert final.usage.output_tokens_details.reasoning_tokens == _reasoning_count()


_GEN = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
_GEN_SWITCH = (
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


@pytest.fixture(scope="module")
def switch_dir(tmp_path_factory):
    """The tiny tokenizer with a template that reads `enable_thinking` as Qwen3's does (off: an
    empty think block after the generation prompt)."""
    import shutil

    d = tmp_path_factory.mktemp("switch")
    for f in TINY.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, d / f.name)
    template = (TINY / "chat_template.jinja").read_text()
    assert _GEN in template
    (d / "chat_template.jinja").write_text(template.replace(_GEN, _GEN_SWITCH))
    return d


_OFF = [
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"},
        {"field": "reasoning_effort", "asked": "none", "enabled": False},
    ),
    (
        "/v1/messages",
        {
            "model": "claude-x",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "disabled"},
        },
        {"field": "thinking", "asked": {"type": "disabled"}, "enabled": False},
    ),
    (
        "/v1/responses",
        {"model": "m", "input": "hi", "reasoning": {"effort": "none", "summary": "auto"}},
        {"field": "reasoning.effort", "asked": "none", "enabled": False},
    ),
]


@pytest.mark.parametrize(("path", "body", "thinking"), _OFF)
def test_thinking_switch_reaches_the_chat_template(make_server, switch_dir, path, body, thinking):
    """Each API's switch turned off reaches a template that reads enable_thinking: the prompt
    ids are the template's with enable_thinking=False, and the record says so (it was accepted
    and ignored: the prompt was the thinking one, nothing recorded)."""
    srv = make_server(["ok"], tokenizer=str(switch_dir))
    r = _post(srv, path, body)
    assert r.status_code == 200, r.text
    (call,) = read_calls(srv.config.record)
    tok = Renderer(str(switch_dir)).tokenizer
    off = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert call.prompt_ids == tok.encode(off, add_special_tokens=False)
    assert call.sampling["thinking"] == {**thinking, "applied": True}


def test_thinking_switch_on_and_in_token_counts(make_server, switch_dir):
    """Switched on, the template's thinking prompt is used; a count gets the same switch."""
    srv = make_server(["ok"], tokenizer=str(switch_dir))
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "high",
    }
    assert _post(srv, "/v1/chat/completions", body).status_code == 200
    (call,) = read_calls(srv.config.record)
    assert call.sampling["thinking"] == {
        "field": "reasoning_effort",
        "asked": "high",
        "enabled": True,
        "applied": True,
    }
    assert R.tokenizer.decode(call.prompt_ids).endswith("<|im_start|>assistant\n")
    h = {"x-api-key": token("s9"), "anthropic-version": "2023-06-01"}
    counts = []
    for kind in ("enabled", "disabled"):
        count_body = {**_count_body("hi"), "thinking": {"type": kind, "budget_tokens": 1024}}
        with httpx.Client(base_url=srv.url) as c:
            counts.append(c.post("/v1/messages/count_tokens", json=count_body, headers=h).json())
    empty_think = len(R.encode("<think>\n\n</think>\n\n"))
    assert counts[1]["input_tokens"] - counts[0]["input_tokens"] == empty_think


@pytest.mark.parametrize(("path", "body", "thinking"), _OFF)
def test_thinking_switch_without_a_template_switch_is_recorded_or_refused(
    make_server, path, body, thinking
):
    """The tiny template reads no enable_thinking: under --thinking record the call is served on
    the template's one prompt and the switch recorded as not applied; under --thinking refuse
    it is a 400 naming the field."""
    srv = make_server(["ok"])
    r = _post(srv, path, body)
    assert r.status_code == 200, r.text
    (call,) = read_calls(srv.config.record)
    assert call.sampling["thinking"] == {**thinking, "applied": False}
    strict = make_server(["ok"], thinking="refuse", record=None)
    r = _post(strict, path, body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith(thinking["field"] + ":") and "no thinking switch" in message


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        (
            "/v1/chat/completions",
            {"reasoning_effort": "turbo"},
            "reasoning_effort: expected one of",
        ),
        ("/v1/responses", {"reasoning": {"effort": 3}}, "reasoning.effort: expected one of"),
        ("/v1/messages", {"thinking": {"type": "on"}}, "thinking.type: expected 'enabled'"),
        ("/v1/messages", {"thinking": "yes"}, "thinking: expected an object"),
    ],
)
def test_bad_thinking_switch_gets_400(make_server, path, body, needle):
    """A switch the API does not define is a 400 naming it, not silently ignored."""
    base = {
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses": {"model": "m", "input": "hi"},
        "/v1/messages": {
            "model": "c",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        },
    }[path]
    r = _post(make_server(), path, {**base, **body})
    assert r.status_code == 400 and needle in r.text, r.text


# --- memory goes back after a big request ---------------------------------------------------


def test_memory_is_released_after_a_big_request(make_server, monkeypatch):
    """A request whose body is over 1 MiB hands the heap's free pages back to the OS when it
    is done (glibc malloc_trim on a worker thread); small requests do not pay for a trim. The
    RSS it saves is measured in bench/test_proxy_hardening.py, not here."""
    from claw_proxy import _hygiene

    if _hygiene._TRIM is None:
        pytest.skip("no glibc malloc_trim in this C library: nothing to release with")
    assert _hygiene.release_memory() is True
    calls = []
    monkeypatch.setattr(_hygiene, "release_memory", lambda: calls.append(1) or True)
    srv = make_server(max_prompt_tokens=1000)
    assert _post(srv, "/v1/chat/completions", _chat_body("small")).status_code == 200
    assert srv.proxy.app.trims == 0
    big = "word " * 220_000  # 1.1 MB: refused from its text (a quick 413), but big all the same
    assert _post(srv, "/v1/chat/completions", _chat_body(big)).status_code == 413
    assert _count(srv, big).status_code == 413
    app = srv.proxy.app
    for _ in range(400):  # after the response is sent, the trim is started on a worker thread
        if len(calls) == 2:
            break
        time.sleep(0.05)
    assert len(calls) == 2 and app.trims == 2 and app.big_in_flight == 0


def _chat_body(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def test_reasoning_tokens_count_the_tokens_that_overlap_the_think_span():
    """Tokens count as reasoning when their text overlaps `<think>` ... `</think>`, also where
    the tags are split across tokens; an answer that never closes its reasoning counts to the
    end; none without an opening tag."""
    from claw_proxy._thinking import reasoning_tokens

    def count(pieces: list[str]) -> int:
        ends, n = [], 0
        for p in pieces:
            n += len(p)
            ends.append(n)
        return reasoning_tokens("".join(pieces), ends, "<think>", "</think>")

    assert count(["a", "<th", "ink>x", "y</", "think>", "b", "c"]) == 4
    assert count(["<think>", "x", "</think>", "\n\n", "answer"]) == 3
    assert count(["<think>", "x", "", "y"]) == 4  # cut off while thinking
    assert count(["just", " text", "</think>"]) == 0


def test_bound_counts_only_roles_the_template_writes_verbatim(tmp_path):
    """A template that trims user messages does not get them counted (their text in the prompt
    may be shorter than sent); system and tool messages still are."""
    import shutil

    from claw_proxy._bound import PromptBound

    for f in TINY.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    template = (TINY / "chat_template.jinja").read_text()
    user = "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    assert user in template
    trimmed = "{{- '<|im_start|>' + message.role + '\\n' + (text(message.content) | trim) + '<|im_end|>\\n' -}}"
    (tmp_path / "chat_template.jinja").write_text(template.replace(user, trimmed))
    bound = PromptBound(Renderer(str(tmp_path)))
    assert bound.roles == {"system", "tool"}
    assert PromptBound(R).roles == {"system", "user", "tool"}


def test_passthrough_calls_hold_a_session_slot_and_the_prompt_limit(make_server):
    """A passthrough call counts in its session's in-flight limit until its answer has been
    sent, streamed or not (it ran outside any limit), and a teacher's call whose student
    prompt is over --max-prompt-tokens is refused before the upstream is asked."""
    hits = []

    def app_with_count():
        inner = _no_arg_teacher()

        async def app(scope, receive, send):
            if scope["type"] == "http":
                hits.append(scope["path"])
            await inner(scope, receive, send)

        return app

    srv = make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        student_ids=True,
        session_concurrency=1,
        max_prompt_tokens=100,
        transport=httpx.ASGITransport(app=app_with_count()),
    )
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "list"}],
    }
    _session(srv, "s1")
    srv.proxy.sessions["s1"].in_flight = 1
    assert _post(srv, "/v1/messages", body).status_code == 429 and hits == []
    srv.proxy.sessions["s1"].in_flight = 0
    assert _post(srv, "/v1/messages", body).status_code == 200 and len(hits) == 1
    for _ in range(400):  # released once the last byte is sent: the client may see it first
        if _session(srv, "s1")["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert _session(srv, "s1")["in_flight"] == 0
    long = {**body, "messages": [{"role": "user", "content": "word " * 200}]}
    r = _post(srv, "/v1/messages", long)
    assert r.status_code == 413 and "limit of 100" in r.text and len(hits) == 1
    assert _session(srv, "s1")["in_flight"] == 0
