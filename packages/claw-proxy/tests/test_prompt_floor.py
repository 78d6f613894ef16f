"""An over-limit prompt is refused after counting up to --max-prompt-tokens, whatever its size
(issue 39 item 8): the fewest-pieces count of `_bound.TokenFloor`, for the tiny tokenizer and
for byte-level BPE vocabularies trained here (one plain, one Qwen2-style with NFC), is a lower
bound of the rendered prompt's tokens and stops once past the limit."""

from __future__ import annotations

import json
import random
import unicodedata

import httpx
import pytest
from claw_proxy import _bound, api_chat
from claw_proxy._bound import PromptBound
from claw_proxy.render import Renderer
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_testlib import TINY, bpe_dir, token


@pytest.fixture(scope="module", params=["tiny", "bpe", "bpe-nfc"])
def kind(request, tmp_path_factory):
    """(name, HF directory, renderer, bound) for each tokenizer."""
    name = request.param
    d = (
        TINY
        if name == "tiny"
        else bpe_dir(tmp_path_factory.mktemp(name), normalizer="NFC" if name == "bpe-nfc" else None)
    )
    r = Renderer(str(d))
    return name, d, r, PromptBound(r)


def _words(n_chars: int, seed: int = 0) -> str:
    rnd = random.Random(seed)
    words = ["the", "proxy", "token", "über", "日本語", "   ", "\n", "x = 12345", "----", "é"]
    out, size = [], 0
    while size < n_chars:
        w = rnd.choice(words) + " "
        out.append(w)
        size += len(w)
    return "".join(out)[:n_chars]


def _post(srv, text: str, session: str = "s1") -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    h = {"content-type": "application/json", "x-api-key": token(session)}
    with httpx.Client(base_url=srv.url, timeout=600) as c:
        return c.post("/v1/chat/completions", content=json.dumps(body).encode(), headers=h)


class _Counting:
    """Counts the characters given to a renderer's template and tokenizer (on the instance)."""

    def __init__(self, renderer) -> None:
        self.chars = 0
        for name in ("_template", "encode", "render_full"):
            setattr(renderer, name, self._wrap(getattr(renderer, name)))

    def _wrap(self, inner):
        def counted(*args, **kw):
            self.chars += len(json.dumps(args, default=str))
            return inner(*args, **kw)

        return counted


def test_4mb_prompt_is_refused_after_counting_up_to_the_limit(make_server, kind):
    """A 4 MB prompt under the characters rule (the tiny tokenizer's 26 bytes a token, the BPE
    vocabularies' 512) gets 413 naming the limit and the count so far, without the template or
    the tokenizer being run, after the counting tokenizer saw O(limit) characters."""
    name, d, _, bound = kind
    limit = 170_000 if name == "tiny" else 10_000  # 4 MB / longest token stays under it
    srv = make_server(tokenizer=str(d), max_prompt_tokens=limit, max_body_bytes=32 << 20)
    text = _words(4 << 20)
    assert -(-len(text) // srv.proxy.bounds[str(d)].bytes_per_token) <= limit
    renders = _Counting(srv.proxy.renderers[str(d)])
    r = _post(srv, text)
    assert r.status_code == 413, r.text
    assert renders.chars == 0, f"{renders.chars} characters rendered before the 413"
    msg = r.json()["error"]["message"]
    assert f"limit of {limit} (--max-prompt-tokens)" in msg and "has at least" in msg
    assert int(msg.split("at least ")[1].split()[0]) > limit
    floor = srv.proxy.bounds[str(d)].floor
    assert floor.counted_chars <= 4 * limit + _bound._BATCH < len(text) // 4


def test_just_under_the_limit_passes_and_just_over_is_refused(make_server, kind):
    """At the rendered prompt's exact token count the call is served; one token less of limit
    and it is a 413 (from the exact count after rendering) naming the limit and the count."""
    name, d, r, _ = kind
    text = _words(20_000, seed=3)
    n = len(
        r.render_full(
            api_chat.parse({"model": "m", "messages": [{"role": "user", "content": text}]})
        )
    )
    srv = make_server(tokenizer=str(d), max_prompt_tokens=n)
    assert _post(srv, text).status_code == 200
    srv = make_server(tokenizer=str(d), max_prompt_tokens=n - 1)
    got = _post(srv, text)
    assert got.status_code == 413
    assert f"the prompt has {n} tokens, over this proxy's limit of {n - 1}" in got.text


_PIECES = [
    "-" * 512,
    "=" * 256,
    " " * 300,
    "<|im_end|>",
    "<|im_",
    "end|>",
    "<think>",
    "</tool_response>",
    " ",
    "\n",
    "e\u0301",  # e + combining acute: NFC composes it
    "\u1100\u1161\u11a8",  # Hangul jamo L+V+T
    "\U0001d400",
    "ß",
    "日本語",
    "über",
    " the",
    "proxy",
    "12345",
]


def _texts(rnd: random.Random) -> list[str]:
    out = []
    for _ in range(rnd.randint(1, 4)):
        n = rnd.choice([1, 5, 40, 400])
        out.append("".join(rnd.choice(_PIECES) for _ in range(n)))
    return out


def _prompt_tokens(r, texts: list[str]) -> int:
    msgs: list[dict] = []
    for i, t in enumerate(texts):
        if i % 2:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": t})
        else:
            msgs.append({"role": "user", "content": t})
    return len(r.render_full(api_chat.parse({"model": "m", "messages": msgs})))


@pytest.mark.parametrize("chunk", [3, 37, 8192])
def test_count_never_exceeds_the_rendered_prompt(kind, chunk, monkeypatch):
    """Over 150 random conversations of long tokens, added tokens (whole and cut), combining
    marks, Hangul jamo and astral characters, cut into chunks as small as 3 characters (so
    chunk edges fall everywhere), the count is never more than the rendered prompt's tokens:
    no false 413."""
    _, _, r, bound = kind
    monkeypatch.setattr(_bound, "CHUNK", chunk)
    rnd = random.Random(chunk)
    for _ in range(150):
        texts = _texts(rnd)
        n = bound.floor.count(texts, 10**9)
        bound.floor._memo.clear()
        assert n <= _prompt_tokens(r, texts), texts


def test_count_is_close_to_the_rendered_prompt(kind):
    """On ordinary text the count is within 25% of the real token count (so an over-limit
    prompt is refused after counting a little past the limit)."""
    _, _, r, bound = kind
    text = _words(100_000, seed=5)
    n = bound.floor.count([text], 10**9)
    assert 0.75 * _prompt_tokens(r, [text]) <= n <= _prompt_tokens(r, [text])


def _reference_fewest(text: str, pieces: set[str], longest: int) -> int:
    return _bound._fewest(_bound._as_bytes(text), pieces, longest)[-1]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(_PIECES[3:] + ["a", "b", "ab", "th"]), max_size=30).map("".join))
def test_counting_tokenizer_finds_the_fewest_pieces(text):
    """The counting tokenizer (a Viterbi pass over the vocabulary) covers a text with exactly
    the fewest pieces a plain dynamic programme finds."""
    r = Renderer(str(TINY))
    floor = PromptBound(r).floor
    vocab = set(r.tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False))
    added = {_bound._as_bytes(a) for a in r.tokenizer.get_added_vocab()}
    pieces = vocab | added | set(_bound._BYTES.values())
    assert floor.pieces([text]) == [_reference_fewest(text, pieces, max(map(len, pieces)))]


_MIXED = st.text(
    alphabet=st.sampled_from(
        [
            "a",
            "K",
            " ",
            "e",
            "\u0301",
            "\u0327",
            "\u1100",
            "\u1161",
            "\u11a8",
            "\uac00",
            "日",
            "\u212a",
            "\U0001d400",
            "ﬁ",
            "Σ",
            "\u0345",
            "\u3099",
            "か",
        ]
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(a=_MIXED, b=_MIXED, c=_MIXED)
def test_normalisers_do_not_reach_across_a_stable_character(a, b, c):
    """Where a chunk begins and ends (before ASCII, CJK ideographs, Hangul syllables), NFC, NFD,
    NFKC, NFKD and Lowercase act on each side apart, so a chunk's normal form is a piece of
    the prompt's."""
    from tokenizers import normalizers

    for stable in ("x", " ", "日", "\uac01"):
        s = b + stable + c
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            whole = unicodedata.normalize(form, a + stable + s)
            assert whole == unicodedata.normalize(form, a) + unicodedata.normalize(form, stable + s)
        low = normalizers.Lowercase()
        assert low.normalize_str(a + s) == low.normalize_str(a) + low.normalize_str(s)


def test_a_message_counted_once_is_not_counted_again(kind):
    """A conversation that grows by a message a turn pays for the new message only."""
    _, _, _, bound = kind
    floor = bound.floor
    old, new = _words(30_000, seed=8), _words(3_000, seed=9)
    first = floor.count([old], 10**9)
    before = floor.counted_chars
    assert floor.count([old, new], 10**9) == first + floor.count([new], 10**9)
    assert 0 < floor.counted_chars - before <= len(new)  # once: then remembered too


def test_no_bound_where_text_may_be_dropped_or_absorbed():
    """A pre-tokenizer that drops whitespace or an added token that strips the whitespace
    around it makes tokens cover text they do not spell: no bound of either rule."""
    from claw_proxy._bound import TokenFloor, _covering

    spec = json.loads((TINY / "tokenizer.json").read_text())
    assert _covering(spec) and TokenFloor.supports(spec)
    ws = {
        **spec,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "WhitespaceSplit"}, spec["pre_tokenizer"]],
        },
    }
    stripping = {**spec, "added_tokens": [{**spec["added_tokens"][0], "lstrip": True}]}
    prefixed = {**spec, "pre_tokenizer": {**spec["pre_tokenizer"], "add_prefix_space": True}}
    for bad in (ws, stripping, prefixed):
        assert not _covering(bad) and not TokenFloor.supports(bad)


def _tiny_messages(n: int, seed: int) -> list[dict]:
    """`n` short user and tool messages (1 to 12 characters), as a harness replaying many
    small tool results would send them."""
    rnd = random.Random(seed)
    msgs: list[dict] = []
    for i in range(n):
        text = "".join(rnd.choice(_PIECES[8:]) for _ in range(rnd.randint(1, 3)))[:12] or "x"
        if i % 3 == 2:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
        else:
            msgs.append({"role": "user", "content": text})
    return msgs


def test_the_template_separates_every_counted_message(kind):
    """The test templates put an added token (<|im_end|>, <|im_start|>, </tool_response>)
    between any two user or tool texts, so each message counts at least one token; a
    template that writes two messages' texts side by side does not get the rule."""
    _, _, r, bound = kind
    assert bound.separated
    spec = json.loads(r.tokenizer.backend_tokenizer.to_str())
    joined = Renderer(str(kind[1]))
    joined._template = lambda msgs, tools, gen: "".join(m.get("content") or "" for m in msgs)
    assert not _bound.separated(joined, bound.roles, spec)


def test_many_tiny_messages_are_refused_after_counting_messages(make_server, kind):
    """Hostile: 4 MB as 400,000 messages of a few characters each. Each is shorter than the
    fewest-pieces count's edge slack, so that count alone gives 0 for every one; the
    message rule refuses the prompt with 413 before the template or the tokenizer runs."""
    name, d, _, _ = kind
    limit = 10_000
    srv = make_server(tokenizer=str(d), max_prompt_tokens=limit, max_body_bytes=64 << 20)
    msgs = [{"role": "user", "content": "ab cd efgh"} for _ in range(400_000)]
    renders = _Counting(srv.proxy.renderers[str(d)])
    body = {"model": "m", "messages": msgs}
    h = {"content-type": "application/json", "x-api-key": token("s1")}
    with httpx.Client(base_url=srv.url, timeout=600) as c:
        r = c.post("/v1/chat/completions", content=json.dumps(body).encode(), headers=h)
    assert r.status_code == 413, r.text
    assert renders.chars == 0, f"{renders.chars} characters rendered before the 413"
    msg = r.json()["error"]["message"]
    assert "400000 messages, each at least one token" in msg, msg
    assert f"limit of {limit} (--max-prompt-tokens)" in msg


@pytest.mark.parametrize("seed", range(3))
def test_the_message_rule_never_exceeds_the_rendered_prompt(kind, seed):
    """Over 40 random conversations of up to 300 short user and tool messages (added tokens,
    long runs and combining marks among them), the rules' bound is never more than the
    rendered prompt's tokens: no false 413 from counting messages."""
    _, _, r, bound = kind
    rnd = random.Random(seed)
    for _ in range(40):
        msgs = _tiny_messages(rnd.randint(1, 300), rnd.randrange(1 << 30))
        req = api_chat.parse({"model": "m", "messages": msgs})
        n, _ = bound.at_least(req)
        assert n >= len(bound.texts(req)) > 0
        assert n <= len(r.render_full(req)), msgs
