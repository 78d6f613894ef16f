"""The loop (examples/mix_harness_rl.py) on vLLM, the production engine path, on CPU.

vLLM runs as examples/gpu/launch.sh starts it (the flags of examples/gpu/vllm-policy.args: the
worker extension with `claw_reload_weights`, prefix caching, processed logprobs; dev-mode reload
routes), here on the CPU build in .venvs/vllm (./dev/install-vllm; without it the slow test is
skipped with that reason). The loop runs 2 GRPO steps against it with `--engine vllm:URL`,
pushing the new weights into vLLM after each step.

Stated tolerance: the logprobs vLLM returned for sampled tokens, as the proxy recorded them,
match transformers' float32 log-softmax of the pushed policy's weights within LOGPROB_TOL
(absolute): both run the same float32 model, and only the order of summation differs (~1e-6
measured); the previous policy's weights miss them by far more (the check can tell versions apart).
"""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest
from _real import sandbox_env
from _servers import ROOT, TINY
from _vllm import Reference, policy_flags, vllm_missing, vllm_server

LOOP = ROOT / "examples" / "mix_harness_rl.py"
LOGPROB_TOL = 1e-4
TASKS = ("toy-digits", "toy-hello")


def _loop_module():
    sys.path.insert(0, str(LOOP.parent))
    try:
        import mix_harness_rl
    finally:
        sys.path.remove(str(LOOP.parent))
    return mix_harness_rl


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_transformers_stays_the_default_engine():
    """With no --engine the loop serves the policy in-process (no vLLM needed); launch.sh starts
    vLLM with the flags the CPU tests read (bench/test_gpu_check.py runs its dry run)."""
    m = _loop_module()
    assert m.options([]).engine == "transformers"
    flags = policy_flags()
    assert "--enable-prefix-caching" in flags
    assert flags[flags.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert flags[flags.index("--worker-extension-cls") + 1].startswith("claw_vllm_worker.")
    launch = (LOOP.parent / "gpu" / "launch.sh").read_text()
    assert "examples/gpu/vllm-policy.args" in launch or all(f in launch for f in flags)


def _weight_versions(url: str, seen: dict):
    """The loop's log callback: at the start of each step's rollouts, vLLM's weight version."""

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
        if ": running " in msg:
            step = int(msg.split()[1].rstrip(":"))
            seen.setdefault(step, httpx.get(url + "/weight_info", timeout=30).json())

    return log


def _max_diff(calls: list[dict], model_dir) -> float:
    ref = Reference(model_dir)
    worst = 0.0
    for c in calls:
        got = ref.logprobs(c["prompt_ids"], c["completion_ids"], c.get("sampling"))
        worst = max(
            worst, *(abs(a - b) for a, b in zip(c["completion_logprobs"], got, strict=True))
        )
    return worst


@pytest.mark.slow
def test_two_grpo_steps_on_vllm(tmp_path, monkeypatch):
    """2 GRPO steps with --engine vllm:URL: step 2's calls are all served by policy v1, vLLM's
    weight version follows every push, and the recorded logprobs are those of the pushed weights."""
    if why := vllm_missing():
        pytest.skip(why)
    sandbox_env(monkeypatch)
    m, run, seen = _loop_module(), tmp_path / "run", {}
    t0 = time.monotonic()
    with vllm_server(tmp_path, TINY, name="policy") as (url, ready_s):
        info = httpx.get(url + "/server_info", params={"config_format": "json"}, timeout=30)
        config = info.json()["vllm_config"]
        argv = [
            *("--run-dir", str(run), "--model", str(TINY), "--tokenizer", str(TINY)),
            *("--engine", f"vllm:{url}", "--vllm-reload-method", "claw_reload_weights"),
            *("--steps", "2", "--rollouts", "2", "--task", TASKS[0], "--task", TASKS[1]),
            *("--harness", "claw-agent-text", "--backend", "process", "--parallel", "2"),
            *("--max-new-tokens", "16", "--epochs", "1", "--minibatches", "1", "--seed", "0"),
        ]
        history = m.main(argv, log=_weight_versions(url, seen))
        final = httpx.get(url + "/weight_info", timeout=30).json()
    took = time.monotonic() - t0
    assert config["cache_config"]["enable_prefix_caching"] is True
    assert config["model_config"]["logprobs_mode"] == "processed_logprobs"

    policies = _rows(run / "policies.jsonl")
    assert [p["version"] for p in policies] == [1, 2] and len(history) == 2
    calls = _rows(run / "calls.jsonl")
    by_step = [
        [c for c in calls if c["session"] in {o["session"] for o in _rows(d / "outcomes.jsonl")}]
        for d in (run / "steps" / "0000", run / "steps" / "0001")
    ]
    assert all(by_step) and sum(map(len, by_step)) == len(calls)
    assert all(c["engine"] == f"vllm:{url}" for c in calls)
    assert {c["policy"]["version"] for c in by_step[0]} == {0}
    assert {c["policy"]["version"] for c in by_step[1]} == {1}  # every call of step 2: v1
    # vLLM's own weight version: v0 pushed before step 1, v1 before step 2, v2 after it
    assert {k: v["weight_version"] for k, v in seen.items()} == {0: "0", 1: "1"}
    assert final["weight_version"] == "2"

    sample = [c for c in by_step[1] if c["completion_ids"]][:3]
    new = _max_diff(sample, policies[0]["path"])
    old = _max_diff(sample, TINY)
    print(
        f"\n2 GRPO steps on vLLM in {took:.0f} s (server ready in {ready_s:.0f} s), "
        f"{len(calls)} calls; step 2 logprobs vs v1: max |diff| {new:.2e}, vs v0: {old:.2e}"
    )
    assert new <= LOGPROB_TOL, f"vLLM logprobs differ from the pushed policy's by {new:.3g}"
    assert old > 100 * LOGPROB_TOL, "the logprobs still match v0: the push did not take"
