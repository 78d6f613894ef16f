"""The loop on vLLM's CPU build with new weights in memory (issue 41): examples/mix_harness_rl.py
--engine vllm:URL --weights memory. Each new version goes from the in-process learner over a
gloo process group into vLLM's worker (examples/gpu/claw_vllm_worker.py's
claw_receive_weights through /collective_rpc), not through a policy directory; the checks are
test_vllm_loop.py's: step 2's calls are all v1, vLLM's weight version follows every push, and
the recorded logprobs are those of the pushed weights (v1's, read back from the learner's
checkpoint 1, since v1 has no policy directory)."""

from __future__ import annotations

import time

import httpx
import pytest
from _real import sandbox_env
from _servers import TINY
from _vllm import vllm_missing, vllm_server
from test_vllm_loop import LOGPROB_TOL, TASKS, _loop_module, _max_diff, _rows, _weight_versions


@pytest.mark.slow
def test_two_grpo_steps_on_vllm_with_weights_in_memory(tmp_path, monkeypatch):
    """2 GRPO steps, --weights memory --checkpoint-every 5: no policy/v1 directory; step 2's
    calls are v1's, vLLM reports each pushed version, logprobs match the pushed weights."""
    if why := vllm_missing():
        pytest.skip(why)
    sandbox_env(monkeypatch)
    m, run, seen = _loop_module(), tmp_path / "run", {}
    t0 = time.monotonic()
    with vllm_server(tmp_path, TINY, name="policy") as (url, ready_s):
        argv = [
            *("--run-dir", str(run), "--model", str(TINY), "--tokenizer", str(TINY)),
            *("--engine", f"vllm:{url}", "--weights", "memory", "--checkpoint-every", "5"),
            *("--steps", "2", "--rollouts", "2", "--task", TASKS[0], "--task", TASKS[1]),
            *("--harness", "claw-agent-text", "--backend", "process", "--parallel", "2"),
            *("--max-new-tokens", "16", "--epochs", "1", "--minibatches", "1", "--seed", "0"),
        ]
        logs: list[str] = []
        log = _weight_versions(url, seen)
        history = m.main(argv, log=lambda msg: (logs.append(msg), log(msg)))
        final = httpx.get(url + "/weight_info", timeout=30).json()
    took = time.monotonic() - t0

    policies = _rows(run / "policies.jsonl")
    assert [p["version"] for p in policies] == [1, 2] and len(history) == 2
    assert not (run / "policy" / "v1").exists() and (run / "policy" / "v2").is_dir()
    pushes = [x for x in logs if "in memory" in x]
    assert len(pushes) == 2, logs
    calls = _rows(run / "calls.jsonl")
    by_step = [
        [c for c in calls if c["session"] in {o["session"] for o in _rows(d / "outcomes.jsonl")}]
        for d in (run / "steps" / "0000", run / "steps" / "0001")
    ]
    assert all(by_step) and sum(map(len, by_step)) == len(calls)
    assert {c["policy"]["version"] for c in by_step[0]} == {0}
    assert {c["policy"]["version"] for c in by_step[1]} == {1}
    assert {k: v["weight_version"] for k, v in seen.items()} == {1: "1"} | (
        {0: seen[0]["weight_version"]} if 0 in seen else {}
    )
    assert final["weight_version"] == "2"

    sample = [c for c in by_step[1] if c["completion_ids"]][:3]
    new = _max_diff(sample, run / "checkpoints" / "0001" / "model")
    old = _max_diff(sample, TINY)
    print(
        f"\n2 GRPO steps on vLLM, weights in memory, in {took:.0f} s (server {ready_s:.0f} s); "
        f"{pushes}; step 2 logprobs vs v1: max |diff| {new:.2e}, vs v0: {old:.2e}"
    )
    assert new <= LOGPROB_TOL, f"vLLM logprobs differ from the pushed policy's by {new:.3g}"
    assert old > 100 * LOGPROB_TOL, "the logprobs still match v0: the push did not take"
