"""--sampling force|honor: what is sampled, what is recorded (`sampling` and logprobs of the
distribution actually sampled from), and the checks on the settings."""

from __future__ import annotations

import math

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, read_calls
from claw_proxy.config import resolve_sampling
from claw_proxy.errors import RecordError, RequestError
from claw_proxy.messages import Sampling
from claw_proxy.records import Call, sampling_record
from proxy_testlib import SECRET, TINY, reference_logprobs, token

torch = pytest.importorskip(
    "torch", reason="the transformers engine needs claw-proxy[transformers]"
)

TOL = 2e-3  # the bound; measured: <= 4.8e-7 (float32; KV cache vs one plain forward)
MSGS = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two transformers-engine servers on the tiny model: the default (force) and honor."""
    made = {}
    for policy in ("force", "honor"):
        d = tmp_path_factory.mktemp(policy)
        kw = {} if policy == "force" else {"sampling": "honor"}
        made[policy] = ProxyServer(
            ProxyConfig(
                engine=f"transformers:{TINY}", secret=SECRET, record=str(d / "calls.jsonl"), **kw
            )
        ).start()
    yield made
    for srv in made.values():
        srv.stop()


def _ask(srv, session: str, **settings) -> Call:
    body = {"model": "m", "messages": MSGS, "max_tokens": 24, "seed": 11, **settings}
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {token(session)}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    (call,) = [c for c in read_calls(srv.config.record) if c.session == session]
    return call


def _forward_logp(model, call, temperature: float) -> list[float]:
    """log_softmax(logits / temperature)[token] from one plain forward over prompt + completion."""
    ids = torch.tensor([call.prompt_ids + call.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)
    n = len(call.prompt_ids)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(call.completion_ids)]


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_honor_records_the_requested_temperature_and_its_logprobs(servers, model):
    """Under honor, a request at T 0.6 is recorded with sampling.temperature 0.6 and logprobs equal
    to log_softmax(logits / 0.6) of an independent forward (and clearly not the T 1 ones)."""
    call = _ask(servers["honor"], "h06", temperature=0.6)
    assert call.sampling == {
        "temperature": 0.6,
        "top_p": 1.0,
        "top_k": 0,
        "forced": False,
        "max_tokens": 24,
        "seed": 11,
    }
    assert _max_diff(call.completion_logprobs, _forward_logp(model, call, 0.6)) <= TOL
    assert _max_diff(call.completion_logprobs, _forward_logp(model, call, 1.0)) > 0.05


def test_honor_top_p_top_k_logprobs_are_truncated_and_renormalised(servers, model):
    """Under honor with top_k and top_p, each logprob is that of the truncated, renormalised
    distribution at the call's temperature (vLLM's rule), which is above the untruncated one."""
    call = _ask(servers["honor"], "htrunc", temperature=0.8, top_p=0.7, top_k=40)
    assert (call.sampling["temperature"], call.sampling["top_p"], call.sampling["top_k"]) == (
        0.8,
        0.7,
        40,
    )
    assert _max_diff(call.completion_logprobs, reference_logprobs(model, call)) <= TOL
    untruncated = _forward_logp(model, call, 0.8)
    gaps = [a - b for a, b in zip(call.completion_logprobs, untruncated, strict=True)]
    assert min(gaps) > 1e-3  # renormalising over a kept set of mass < 1 raises every logprob


def test_honor_greedy_records_zero_logprobs(servers, model):
    """Under honor, temperature 0 samples the argmax and records logprob 0.0 (a point mass)."""
    call = _ask(servers["honor"], "hgreedy", temperature=0.0, top_p=0.5)
    assert call.sampling["temperature"] == 0.0 and call.sampling["top_p"] == 1.0
    assert call.completion_logprobs == [0.0] * len(call.completion_ids)
    assert reference_logprobs(model, call) == call.completion_logprobs  # checks each is the argmax


def test_force_default_records_temperature_one_and_plain_logprobs(servers, model):
    """Under the default (force) the same T 0.6 request is sampled and recorded at T 1, forced,
    with logprobs = log_softmax(logits); a request asking for T 1 is not marked forced."""
    call = _ask(servers["force"], "f06", temperature=0.6, top_p=0.9, top_k=5)
    assert call.sampling == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "forced": True,
        "max_tokens": 24,
        "seed": 11,
    }
    assert _max_diff(call.completion_logprobs, _forward_logp(model, call, 1.0)) <= TOL
    assert _ask(servers["force"], "f10", temperature=1.0).sampling["forced"] is False
    assert _ask(servers["force"], "fnone").sampling["forced"] is False


@pytest.mark.parametrize(
    ("raw", "status_field"),
    [
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":NaN}', None),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":Infinity}', None),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":-1}',
            "temperature",
        ),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}', "top_p"),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"top_k":-2}', "top_k"),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"ignore_eos":"yes"}',
            "ignore_eos",
        ),
    ],
)
def test_bad_sampling_values_get_400_and_no_record(servers, raw, status_field):
    """NaN / Infinity / out-of-range temperature, top_p, top_k: 400, nothing recorded."""
    srv = servers["honor"]
    before = srv.proxy.writer.written
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {token('bad')}", "content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    if status_field:
        assert r.json()["error"]["message"].startswith(status_field), r.text
    assert srv.proxy.writer.written == before


@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_settings_are_refused_naming_the_field(field, value):
    """A parsed body holding a NaN / infinite temperature or top_p is refused naming the field."""
    from claw_proxy import api_chat

    with pytest.raises(RequestError) as e:
        api_chat.parse({"model": "m", "messages": [{"role": "user", "content": "x"}], field: value})
    assert e.value.param == field


def test_ignore_eos_decodes_to_max_tokens_through_eos_tokens(tmp_path, model):
    """`ignore_eos: true` (vLLM's extension) decodes exactly max_tokens, through tokens that would
    have ended the answer, with the logprobs of a plain forward, and never past the proxy's
    --max-tokens-cap; without it the answer stops at the first eos. Here every id is an eos (generation_config), so each answer would end after one
    token."""
    import json
    import shutil

    d = tmp_path / "every-id-eos"
    shutil.copytree(TINY, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = list(range(model.config.vocab_size))
    (d / "generation_config.json").write_text(json.dumps(gen))
    cfg = ProxyConfig(
        engine=f"transformers:{d}",
        secret=SECRET,
        record=str(tmp_path / "c.jsonl"),
        max_tokens_cap=24,
    )
    with ProxyServer(cfg) as srv:
        plain, through = _ask(srv, "plain"), _ask(srv, "through", ignore_eos=True)
        # a client asking for far more is held to the cap: ignore_eos does not lift it
        past_cap = _ask(srv, "past-cap", ignore_eos=True, max_tokens=1_000_000)
    assert len(past_cap.completion_ids) == 24 and past_cap.sampling["max_tokens"] == 24
    assert len(plain.completion_ids) == 1 and plain.finish_reason == "stop"
    assert len(through.completion_ids) == 24 and through.finish_reason == "length"
    assert through.sampling["ignore_eos"] is True and "ignore_eos" not in plain.sampling
    assert _max_diff(through.completion_logprobs, _forward_logp(model, through, 1.0)) <= TOL


def test_resolve_sampling_rules():
    """force: (1, 1, 0), forced only when the request asked for something else; honor: the
    request's settings, defaulted and capped; a temperature below 1e-5 is greedy with no
    truncation; top_k -1 means off."""
    force = ProxyConfig(engine="scripted:x", secret="s")
    honor = ProxyConfig(engine="scripted:x", secret="s", sampling="honor", max_temperature=1.5)
    assert resolve_sampling(force, Sampling()) == (1.0, 1.0, 0, False)
    assert resolve_sampling(force, Sampling(temperature=1.0, top_p=1.0, top_k=0)) == (
        1.0,
        1.0,
        0,
        False,
    )
    assert resolve_sampling(force, Sampling(top_k=3)) == (1.0, 1.0, 0, True)
    assert resolve_sampling(force, Sampling(temperature=0.0)) == (1.0, 1.0, 0, True)
    assert resolve_sampling(honor, Sampling()) == (1.0, 1.0, 0, False)
    assert resolve_sampling(honor, Sampling(temperature=0.6, top_p=0.9, top_k=5)) == (
        0.6,
        0.9,
        5,
        False,
    )
    assert resolve_sampling(honor, Sampling(temperature=9.0)) == (1.5, 1.0, 0, False)
    assert resolve_sampling(honor, Sampling(temperature=1e-6, top_p=0.5, top_k=3)) == (
        0.0,
        1.0,
        0,
        False,
    )
    from claw_proxy.messages import sampling_from

    assert sampling_from({"top_k": -1}, (), None).top_k == 0


def test_sampling_logprobs_match_vllms_rule_on_random_logits():
    """`sampling_logprobs` equals the vLLM-rule reference on random logits (kept set and values),
    and its kept probabilities sum to 1."""
    from claw_proxy._transformers import sampling_logprobs

    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(300, generator=g) * 3
        t = float(torch.empty(1).uniform_(0.2, 2.0, generator=g))
        top_p = float(torch.empty(1).uniform_(0.05, 1.0, generator=g))
        top_k = int(torch.randint(0, 60, (1,), generator=g))
        got = sampling_logprobs(logits, t, top_p, top_k)
        row = logits.double() / t
        if top_k:
            row = torch.where(row < row.sort(descending=True).values[top_k - 1], -torch.inf, row)
        asc, idx = row.sort()
        drop = torch.softmax(asc, -1).cumsum(-1) <= 1 - top_p
        drop[-1] = False
        row[idx[drop]] = -torch.inf
        want = torch.log_softmax(row, -1)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        kept = ~torch.isinf(want)
        assert torch.allclose(got[kept].double(), want[kept], atol=1e-5)
        assert abs(float(got.exp().sum()) - 1) < 1e-5


def test_sampling_record_shape_and_reader_checks():
    """The record's sampling object has the contract's shape; readers refuse bad values naming the
    field and read a call without `sampling` (older proxies) as T 1, top_p 1, top_k 0."""
    assert sampling_record(0.6, 0.9, 5, False, max_tokens=8, seed=None) == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 5,
        "forced": False,
        "max_tokens": 8,
        "seed": None,
    }
    for bad in ((math.nan, 1.0, 0), (0.5, math.inf, 0), (0.5, 1.0, -1)):
        with pytest.raises(RecordError):
            sampling_record(*bad, False)
    base = {
        "schema": "claw.call/v1",
        "call_id": "c",
        "session": "s",
        "seq": 0,
        "api": "openai.chat",
        "model": "m",
        "policy": {"name": "p", "version": 0},
        "prompt_ids": [1],
        "completion_ids": [2],
        "completion_logprobs": [-0.1],
        "finish_reason": "stop",
        "started_at": 1.0,
        "ended_at": 2.0,
        "tags": {},
    }
    assert Call.from_dict(base).sampled_with == (1.0, 1.0, 0)
    for sampling, field in (
        ({"temperature": -0.5}, "sampling.temperature"),
        ({"top_p": 0}, "sampling.top_p"),
        ({"top_k": 1.5}, "sampling.top_k"),
        ({"forced": "yes"}, "sampling.forced"),
        ({"ignore_eos": 1}, "sampling.ignore_eos"),
    ):
        with pytest.raises(RecordError, match=field):
            Call.from_dict({**base, "sampling": sampling}, "calls.jsonl:3")


def _calls_of(tmp_path, name: str, seed: int | None, sessions: list[str]) -> dict[str, Call]:
    """One fresh server (seed `seed`) answering one request per session, all at once; the
    record of each session's call."""
    import concurrent.futures

    record = tmp_path / f"{name}.jsonl"
    cfg = ProxyConfig(
        engine=f"transformers:{TINY}", secret=SECRET, record=str(record), seed=seed, batch_wait=0.05
    )
    with ProxyServer(cfg) as srv:

        def ask(session: str) -> None:
            body = {"model": "m", "messages": MSGS, "max_tokens": 16}
            headers = {"authorization": f"Bearer {token(session)}"}
            r = httpx.post(
                srv.url + "/v1/chat/completions", json=body, headers=headers, timeout=120
            )
            assert r.status_code == 200, r.text

        with concurrent.futures.ThreadPoolExecutor(len(sessions)) as pool:
            list(pool.map(ask, sessions))
    return {c.session: c for c in read_calls(str(record))}


def test_proxy_seed_gives_each_call_its_own_reproducible_draws(tmp_path):
    """Under `seed`, a call without a request seed samples with call_seed(seed, session, seq),
    recorded as sampling.seed: the same session draws the same tokens alone or batched beside
    other sessions (arrival order does not matter); another seed draws others; no seed: null."""
    from claw_proxy.config import call_seed

    alone = _calls_of(tmp_path, "alone", 5, ["a"])
    crowd = _calls_of(tmp_path, "crowd", 5, ["c", "b", "a", "d"])
    other = _calls_of(tmp_path, "other", 6, ["a"])
    unseeded = _calls_of(tmp_path, "unseeded", None, ["a"])
    assert alone["a"].sampling["seed"] == crowd["a"].sampling["seed"] == call_seed(5, "a", 0)
    assert call_seed(5, "a", 0) != call_seed(5, "a", 1) != call_seed(5, "b", 1)
    assert 0 <= call_seed(5, "a", 0) < 2**63
    assert alone["a"].completion_ids == crowd["a"].completion_ids
    assert _max_diff(alone["a"].completion_logprobs, crowd["a"].completion_logprobs) < 1e-5
    assert len({tuple(crowd[s].completion_ids) for s in "abcd"}) == 4  # sessions draw apart
    assert other["a"].completion_ids != alone["a"].completion_ids
    assert unseeded["a"].sampling["seed"] is None
