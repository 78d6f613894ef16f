"""Prefill tokens per Claude Code call on vLLM, with and without its prefix cache (issue 28).

Run: PATH=.venvs/workspace/bin:$PATH .venvs/workspace/bin/python -m pytest \
         bench/test_vllm_prefix_cache.py -s -p no:cacheprovider

The real Claude Code (.tools/bin, in bwrap) plays toy-steps tasks through claw-proxy on the CPU
vLLM (.venvs/vllm), started as examples/gpu/launch.sh starts it (vllm-policy.args: prefix
caching on), then again with `--no-enable-prefix-caching` added. Each rollout is a multi-call
session: the task's instruction, then PROMPTS - 1 follow-ups that continue the conversation
(`claude -c -p`, the adapter's continue_command), so every call's prompt extends the one before
it and all share Claude Code's system prompt and tools. The policy is the tiny test model with
the stock tokenizer (tests/fixtures/tiny-qwen3: a Claude Code request is ~25K tokens), made to
end its answers after a few tokens (_vllm.eos_leaning_copy) so the harness finishes each turn.

Read from vLLM's /metrics before and after the rollouts: prompt tokens, the prefilled ones
(prompt_tokens_by_source local_compute) and those the prefix cache supplied (local_cache_hit).
Printed per setting: calls, prompt / prefilled / cached tokens per call and the wall time.
Asserted: without the cache every prompt token is prefilled; with it under half are (Claude
Code's fixed prefix is shared by every call of every session of one policy version).
"""

from __future__ import annotations

import json
import statistics
import time

import attrs
import claw_bench
import pytest
from _real import missing, play, proxy, sandbox_env
from _servers import TINY
from _vllm import eos_leaning_copy, prefill_counters, vllm_missing, vllm_server

TASKS, ROLLOUTS, PROMPTS, MAX_NEW = 2, 2, 3, 32
FOLLOW_UPS = ("Check the file again and fix it if needed.", "Say done when it is right.")


def _multi_call_tasks() -> list:
    """TASKS toy-steps tasks, each a PROMPTS-prompt session continued by the harness."""
    tasks = claw_bench.load_suite("claw-toy").select(tags=["toy-steps", "train"]).tasks[:TASKS]
    prompts = (None, *FOLLOW_UPS)[:PROMPTS]
    return [
        attrs.evolve(
            t,
            meta={
                **t.meta,
                "sessions": [
                    {"id": f"p{i}", "prompt": p or t.instruction, "new_session": False}
                    for i, p in enumerate(prompts)
                ],
            },
        )
        for t in tasks
    ]


def _measure(workdir, policy, cache: bool) -> dict:
    """One vLLM server (prefix cache on or off), the rollouts through claw-proxy, the counters."""
    extra = () if cache else ("--no-enable-prefix-caching",)
    with vllm_server(workdir, policy, name="policy", extra=extra) as (url, _):
        record = workdir / "calls.jsonl"
        with proxy(f"vllm:{url}", record, str(TINY), MAX_NEW) as server:
            before, t0 = prefill_counters(url), time.monotonic()
            batch = play(_multi_call_tasks(), ["claude-code"], server.url, workdir / "runs.jsonl",
                         "cache" if cache else "nocache", samples=ROLLOUTS)  # fmt: skip
            seconds = time.monotonic() - t0
        after = prefill_counters(url)
    calls = [json.loads(x) for x in record.read_text().splitlines() if x.strip()]
    per_session = statistics.fmean(
        sum(c["session"] == o["session"] for c in calls) for o in batch.outcomes
    )
    n = len(calls)
    d = {k: after[k] - before[k] for k in after}
    return {
        "prefix_cache": cache,
        "sessions": len(batch.outcomes),
        "ok": sum(o["status"] == "ok" for o in batch.outcomes),
        "calls": n,
        "calls_per_session": round(per_session, 2),
        "vllm_requests": int(d["requests"]),
        "prompt_tokens_per_call": round(d["prompt_tokens"] / n),
        "recorded_prompt_tokens_per_call": round(statistics.fmean(len(c["prompt_ids"]) for c in calls)),
        "prefill_tokens_per_call": round(d["computed"] / n),
        "cached_tokens_per_call": round(d["cached"] / n),
        "cache_hit_rate": round(d["cache_hits"] / d["cache_queries"], 4) if d["cache_queries"] else 0.0,
        "seconds": round(seconds, 1),
    }  # fmt: skip


@pytest.mark.slow
def test_prefill_tokens_per_claude_code_call(tmp_path, monkeypatch):
    """Claude Code sessions on vLLM: prefill tokens per call with and without the prefix cache."""
    if why := vllm_missing() or missing("claude-code"):
        pytest.skip(why)
    sandbox_env(monkeypatch)
    policy = eos_leaning_copy(TINY, tmp_path / "policy")
    rows = []
    for cache in (True, False):
        (tmp_path / str(cache)).mkdir()
        rows.append(_measure(tmp_path / str(cache), policy, cache))
        print(json.dumps(rows[-1]), flush=True)
    on, off = rows
    print(
        f"\nClaude Code on CPU vLLM, {on['calls']} calls in {on['sessions']} sessions "
        f"({on['calls_per_session']} calls each), ~{on['prompt_tokens_per_call']} prompt tokens a "
        f"call: prefilled {on['prefill_tokens_per_call']} a call with the prefix cache "
        f"({on['cached_tokens_per_call']} cached), {off['prefill_tokens_per_call']} without; "
        f"rollouts {on['seconds']} s vs {off['seconds']} s"
    )
    for r in rows:
        assert r["ok"] == r["sessions"] == TASKS * ROLLOUTS and r["calls"] == r["vllm_requests"]
        assert r["calls_per_session"] > 1  # multi-call sessions
    assert off["cached_tokens_per_call"] == 0
    assert off["prefill_tokens_per_call"] == off["prompt_tokens_per_call"]
    assert on["prefill_tokens_per_call"] < 0.5 * on["prompt_tokens_per_call"]
