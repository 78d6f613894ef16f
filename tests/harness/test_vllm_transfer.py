"""The loop on vLLM's CPU build with new weights in memory (issue 41): examples/mix_harness_rl.py
--engine vllm:URL --weights memory. Each new version goes from the in-process learner over a
gloo process group into vLLM's worker (examples/gpu/claw_vllm_worker.py's
claw_receive_weights through /collective_rpc), not through a policy directory; the checks are
test_vllm_loop.py's: step 2's calls are all v1, vLLM's weight version follows every push, and
the recorded logprobs are those of the pushed weights (v1's, read back from the learner's
checkpoint 1, since v1 has no policy directory)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from _real import sandbox_env
from _servers import ROOT, TINY
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


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="vLLM 0.32 CPU: an in-place reload of the tiny MoE leaves logprobs off the new "
    "weights (pushed: max |diff| 0.84 vs v1, 1.59 vs v0; a directory reload with "
    "claw_reload_weights: 1.13), while the startup load matches transformers to 1e-6",
)
def test_moe_weights_in_memory_load_into_vllm_under_the_checkpoint_names(tmp_path):
    """The tiny Qwen3-MoE (experts fused in transformers 5's memory) pushed over gloo into vLLM's
    CPU build: the sender's per-expert checkpoint names (as save_pretrained writes them) go
    through vLLM's Qwen3-MoE loader, and the next calls' logprobs are those of the pushed weights
    (a transformers reference of the same weights saved to a directory), not v0's."""
    if why := vllm_missing():
        pytest.skip(why)
    if not os.environ.get("CLAW_VLLM_MOE_RELOAD"):
        # a known vLLM CPU defect, not claw's (docs/weights.md): 6 minutes of CI for a known
        # failure; run it with CLAW_VLLM_MOE_RELOAD=1 on a new vLLM to see whether it is fixed
        pytest.skip("vLLM 0.32 CPU reloads an MoE in place wrongly (docs/weights.md); "
                    "CLAW_VLLM_MOE_RELOAD=1 runs this check")  # fmt: skip
    import shutil

    import claw_proxy
    import claw_rl
    import claw_rl.checkpoint
    import torch
    from claw_rl import transfer

    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny-qwen3-moe", tmp_path / "v0")
    learner = claw_rl.Learner.grpo(claw_rl.GRPOConfig(name="policy"), tmp_path / "v0")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    learner.dirty = True
    learner.policy.save_pretrained(tmp_path / "v1")  # the reference only: the push sends no files
    claw_rl.checkpoint.copy_tokenizer_files(tmp_path / "v0", tmp_path / "v1")
    names = [n for n, _ in transfer.layout(learner)]
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") for n in names)
    admin, secret = "admin-moe-transfer", "secret-moe-transfer"
    with vllm_server(tmp_path, tmp_path / "v0", name="policy") as (url, _):
        cfg = claw_proxy.ProxyConfig(
            engine=f"vllm:{url}", tokenizer=str(tmp_path / "v0"), secret=secret,
            admin_token=admin, record=str(tmp_path / "calls.jsonl"),
        )  # fmt: skip
        with claw_proxy.ProxyServer(cfg) as srv:
            policy = transfer.next_policy(learner, str(tmp_path / "v0"))
            sent = transfer.publish(learner, policy, srv.url, admin, bucket_bytes=256 << 10)
            assert sent["failed_ranks"] == [] and sent["buckets"] > 3
            for k in range(3):
                token = claw_proxy.mint_token(f"moe-{k}", secret)
                r = httpx.post(
                    srv.url + "/v1/chat/completions",
                    json={"model": "policy", "seed": k, "max_tokens": 12, "temperature": 1.0,
                          "messages": [{"role": "user", "content": f"count to {k + 3}"}]},
                    headers={"authorization": f"Bearer {token}"}, timeout=300,
                )  # fmt: skip
                assert r.status_code == 200, r.text
        info = httpx.get(url + "/weight_info", timeout=30).json()
    calls = [c for c in _rows(tmp_path / "calls.jsonl") if c["completion_ids"]]
    assert (
        calls and {c["policy"]["version"] for c in calls} == {1} and info["weight_version"] == "1"
    )
    new, old = _max_diff(calls, tmp_path / "v1"), _max_diff(calls, tmp_path / "v0")
    print(f"\nMoE push: {sent['bytes']} B in {sent['buckets']} buckets, {sent['seconds']} s; "
          f"logprobs vs pushed weights max |diff| {new:.2e}, vs v0 {old:.2e}")  # fmt: skip
    assert new <= LOGPROB_TOL, f"vLLM logprobs differ from the pushed MoE policy's by {new:.3g}"
    assert old > 100 * LOGPROB_TOL, "the logprobs still match v0: the push did not take"
