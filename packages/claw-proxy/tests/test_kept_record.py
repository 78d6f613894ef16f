"""`completion_kept`: the in-process engine records each truncated token's kept-set size in the
call (the set it sampled from, less the token), a dense default call writes nothing, and the call
reader checks the field."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, read_calls
from claw_proxy._call import Run
from claw_proxy.errors import RecordError
from claw_proxy.records import Call
from proxy_testlib import SECRET, TINY, token

torch = pytest.importorskip(
    "torch", reason="the transformers engine needs claw-proxy[transformers]"
)

from claw_proxy._transformers import kept_size, sampling_logprobs, truncates  # noqa: E402

MSGS = [{"role": "user", "content": "tell me a story"}]
GOLDEN = {
    "schema": "claw.call/v1",
    "call_id": "c-1",
    "session": "s-1",
    "seq": 0,
    "api": "openai.chat",
    "model": "m",
    "policy": {"name": "tiny", "version": 0},
    "prompt_ids": [1, 2, 3],
    "completion_ids": [4, 5, 6],
    "completion_logprobs": [-0.5, -0.25, -1.0],
    "finish_reason": "stop",
    "started_at": 1.0,
    "ended_at": 2.0,
    "tags": {},
}


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("kept")
    cfg = ProxyConfig(
        engine=f"transformers:{TINY}",
        sampling="honor",
        secret=SECRET,
        record=str(d / "calls.jsonl"),
    )
    srv = ProxyServer(cfg).start()
    yield srv
    srv.stop()


def _ask(srv, session: str, **settings) -> tuple[Call, dict]:
    """The call recorded for one request, as read and as its raw JSON line."""
    body = {"model": "m", "messages": MSGS, "max_tokens": 16, "seed": 5, **settings}
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {token(session)}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    with open(srv.config.record, encoding="utf-8") as f:
        (raw,) = [d for d in map(json.loads, f) if d["session"] == session]
    (call,) = [c for c in read_calls(srv.config.record) if c.session == session]
    return call, raw


def _reference_kept(model, call: Call) -> list[int]:
    """Each completion token's kept-set size less itself from one plain forward pass over the
    call (the engine decoded with a KV cache), under its recorded sampling settings."""
    ids = torch.tensor([list(call.prompt_ids) + call.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    t, p, k = call.sampled_with
    n = len(call.prompt_ids)
    out = []
    for i, tok in enumerate(call.completion_ids):
        logp = sampling_logprobs(logits[n - 1 + i], t, p, k)
        assert torch.isfinite(logp[tok])  # the sampled token is in the set
        out.append(int(torch.isfinite(logp).sum()) - 1)
    return out


def test_top_k_call_records_k_minus_one(server, model):
    """A top_k 7 call records completion_kept = 6 for every token (no ties in float32 logits),
    the sizes a plain forward's sets give."""
    call, raw = _ask(server, "k7", temperature=0.9, top_k=7)
    assert call.completion_kept == [6] * len(call.completion_ids)
    assert raw["completion_kept"] == call.completion_kept
    assert list(raw).index("completion_kept") == list(raw).index("completion_logprobs") + 1
    assert call.completion_kept == _reference_kept(model, call)


def test_top_p_call_records_the_sets_it_sampled_from(server, model):
    """A top_p 0.8 call records sizes that vary from token to token and equal the sets a plain
    forward's logits give; each logprob is over a set of that size (> 0 when it has others)."""
    call, _ = _ask(server, "p08", temperature=1.0, top_p=0.8)
    kept = call.completion_kept
    assert kept is not None and len(kept) == len(call.completion_ids)
    assert min(kept) >= 0 and len(set(kept)) > 1
    assert kept == _reference_kept(model, call)


def test_untruncated_and_greedy_calls_write_no_field(server):
    """A call without top_k / top_p, a greedy call with top_p, and one whose top_k is the whole
    vocabulary have no completion_kept key in their line (default runs stay byte-identical)."""
    vocab = 1 << 20  # above the tiny vocabulary: top_k off
    for session, settings in (
        ("plain", {"temperature": 1.0}),
        ("greedy", {"temperature": 0.0, "top_p": 0.5}),
        ("allk", {"temperature": 1.0, "top_k": vocab}),
    ):
        call, raw = _ask(server, session, **settings)
        assert "completion_kept" not in raw and call.completion_kept is None, session


def test_scripted_engine_writes_no_field(make_server, clients):
    """An engine that cannot know the sets (scripted) records none, even under top_k."""
    srv = make_server(["hello there"], sampling="honor")
    oa = clients.openai(srv)
    oa.chat.completions.create(model="m", messages=MSGS, temperature=0.7, extra_body={"top_k": 5})
    with open(srv.config.record, encoding="utf-8") as f:
        (raw,) = [json.loads(x) for x in f]
    assert raw["sampling"]["top_k"] == 5 and "completion_kept" not in raw


def test_engine_helpers():
    """truncates: top_k below V or top_p < 1 at T > 0; kept_size counts the finite others."""
    assert truncates(1.0, 0.9, 0, 10) and truncates(0.5, 1.0, 3, 10)
    assert not truncates(1.0, 1.0, 0, 10) and not truncates(1.0, 1.0, 10, 10)
    assert not truncates(0.0, 0.5, 3, 10)
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    assert kept_size(sampling_logprobs(logits, 1.0, top_k=3)) == 2
    assert kept_size(sampling_logprobs(logits, 1.0, top_p=0.5)) == 0  # 0.64 alone reaches it
    assert kept_size(sampling_logprobs(logits, 1.0)) == 4


def test_run_cuts_the_engine_list_to_the_tokens_read():
    """The engine may sample past a stop sequence: the record keeps the first len(ids) sizes;
    a list shorter than the tokens (an engine that does not record) gives no field."""
    kept = Run._kept  # reads only self.gen.kept and self.ids
    assert kept(SimpleNamespace(gen=SimpleNamespace(kept=[3, 3, 2, 9]), ids=[7, 8, 9])) == [3, 3, 2]
    assert kept(SimpleNamespace(gen=SimpleNamespace(kept=[-1, -1]), ids=[7, 8])) is None
    assert kept(SimpleNamespace(gen=SimpleNamespace(kept=[1]), ids=[7, 8])) is None
    assert kept(SimpleNamespace(gen=SimpleNamespace(), ids=[7])) is None


def test_reader_checks_completion_kept():
    """Call.from_dict reads completion_kept (ints >= -1, one per completion id) and writes it
    back after completion_logprobs; bad values name the field and index."""
    call = Call.from_dict({**GOLDEN, "completion_kept": [3, -1, 0]})
    assert call.completion_kept == [3, -1, 0]
    d = call.to_dict()
    assert list(d).index("completion_kept") == list(d).index("completion_logprobs") + 1
    assert "completion_kept" not in Call.from_dict(GOLDEN).to_dict()
    for value, error in (
        ([3, -1], "completion_kept': 2 values for 3"),
        ([3, -2, 0], "completion_kept'[1] must be an integer >= -1"),
        ([3, 1.5, 0], "completion_kept'[1]"),
        ([3, True, 0], "completion_kept'[1]"),
        ("3,1,0", "completion_kept' has the wrong type"),
    ):
        with pytest.raises(RecordError) as err:
            Call.from_dict({**GOLDEN, "completion_kept": value}, where="calls.jsonl:4")
        assert error in str(err.value) and "calls.jsonl:4" in str(err.value)
