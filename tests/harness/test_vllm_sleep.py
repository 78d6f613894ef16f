"""The loop on vLLM's CPU build with --engine-sleep (issue 41, one GPU box): before each update
the proxy holds new calls and puts vLLM to sleep (/sleep: level 2 with --weights memory, level 1
with --weights disk), the learner trains, and the new weights wake it (/wake_up?tags=weights,
the reload, /wake_up?tags=kv_cache). vLLM's CPU build cannot start with --enable-sleep-mode
("Sleep mode is not supported on current platform."); without it its sleep routes still run
(the scheduler is paused and resumed; the CPU worker frees nothing), so this checks the order
and the outcome, not the memory: step 2's calls are v1's with v1's logprobs, and vLLM is awake
and serving at the end."""

from __future__ import annotations

import time

import httpx
import pytest
from _real import sandbox_env
from _servers import TINY
from _vllm import vllm_missing, vllm_server
from test_vllm_loop import LOGPROB_TOL, TASKS, _loop_module, _max_diff, _rows


@pytest.mark.slow
# level 2 with weights in memory, the one-box layout launch.sh starts; level 1 (--weights disk)
# is the same sequence with a reload from the policy directory (test_sleep.py, against a fake
# vLLM), and each real vLLM start costs CI minutes
@pytest.mark.parametrize("weights, level", [("memory", 2)])
def test_two_grpo_steps_with_the_engine_asleep_while_training(
    tmp_path, monkeypatch, weights, level
):
    """2 GRPO steps with --engine-sleep: each step sleeps vLLM at `level` before the update
    and wakes it with the new version; step 2's calls are v1's and match v1's logprobs."""
    if why := vllm_missing():
        pytest.skip(why)
    sandbox_env(monkeypatch)
    m, run = _loop_module(), tmp_path / "run"
    t0 = time.monotonic()
    with vllm_server(tmp_path, TINY, name="policy") as (url, ready_s):
        argv = [
            *("--run-dir", str(run), "--model", str(TINY), "--tokenizer", str(TINY)),
            *("--engine", f"vllm:{url}", "--weights", weights, "--engine-sleep"),
            *("--steps", "2", "--rollouts", "2", "--task", TASKS[0], "--task", TASKS[1]),
            *("--harness", "claw-agent-text", "--backend", "process", "--parallel", "2"),
            *("--max-new-tokens", "16", "--epochs", "1", "--minibatches", "1", "--seed", "0"),
        ]
        logs: list[str] = []
        history = m.main(argv, log=logs.append)
        final = httpx.get(url + "/weight_info", timeout=30).json()
        asleep = httpx.get(url + "/is_sleeping", timeout=30).json()
    took = time.monotonic() - t0
    assert len(history) == 2 and asleep == {"is_sleeping": False}
    sleeps = [x for x in logs if x.startswith("engines asleep")]
    assert sleeps and all(f"(level {level})" in x for x in sleeps), logs
    calls = _rows(run / "calls.jsonl")
    step1 = {o["session"] for o in _rows(run / "steps" / "0001" / "outcomes.jsonl")}
    later = [c for c in calls if c["session"] in step1]
    versions = [p["version"] for p in _rows(run / "policies.jsonl")]
    assert later and {c["policy"]["version"] for c in later} == {versions[0]}
    assert final["weight_version"] == str(versions[-1])
    sample = [c for c in later if c["completion_ids"]][:3]
    new = _max_diff(sample, run / "checkpoints" / "0001" / "model")
    print(
        f"\n--engine-sleep, --weights {weights}: 2 GRPO steps in {took:.0f} s (server "
        f"{ready_s:.0f} s); {sleeps}; step 2 logprobs vs v1: max |diff| {new:.2e}"
    )
    assert new <= LOGPROB_TOL, f"vLLM logprobs differ from the woken policy's by {new:.3g}"
