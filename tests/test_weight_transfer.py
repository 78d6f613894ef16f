"""New weights reach the engines in memory (issue 41): claw-rl's transfer sender against
claw-proxy's receivers over a gloo process group on loopback (CPU), and the same-process
shortcut. Plain data between the packages: the claw.policy/v1 record over HTTP, tensors over
the group."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import claw_proxy
import claw_proxy.render
import claw_proxy.routing
import claw_rl
import claw_rl.checkpoint
import httpx
import pytest
import torch
from claw_rl import _lora as claw_rl_lora
from claw_rl import transfer
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
TINY_MOE = ROOT / "tests" / "fixtures" / "tiny-qwen3-moe"
ADMIN, SECRET = "admin-token-for-transfer", "secret-for-transfer"


def _learner(tmp: Path, moe: bool = False, **cfg) -> claw_rl.Learner:
    """A learner on a new tiny policy (tmp/v0; `moe`: a copy of the tiny Qwen3-MoE fixture)
    with weights moved away from v0's."""
    if moe:
        shutil.copytree(TINY_MOE, tmp / "v0")
    else:
        claw_rl.init_tiny(tmp / "v0", claw_rl.TinySpec())
    learner = claw_rl.Learner.grpo(claw_rl.GRPOConfig(name="policy", **cfg), tmp / "v0")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    learner.dirty = True
    return learner


def _chat(url: str, session: str, **kw) -> httpx.Response:
    tok = claw_proxy.mint_token(session, SECRET)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    r = httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {tok}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r


def _calls(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait_url(path: Path, proc: subprocess.Popen, what: str) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if path.exists() and path.read_text():
            url = path.read_text().strip()
            try:
                httpx.get(url + "/v1/models", timeout=2)
                return url
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start")


def test_a_proxy_process_takes_a_version_over_the_group_and_serves_it(tmp_path):
    """The transformers engine in a `claw-proxy serve` process receives v1 over gloo (several
    buckets); its next call records v1, and its tokens and logprobs equal those of a proxy that
    loaded the same weights from a fresh directory."""
    learner = _learner(tmp_path)
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "admin").write_text(ADMIN + "\n")
    (tmp_path / "url").write_text("")
    port = 20000 + (hash(str(tmp_path)) % 20000)
    argv = [str(BIN / "claw-proxy"), "serve", "--engine", f"transformers:{tmp_path / 'v0'}"]
    argv += [
        "--secret-file",
        str(tmp_path / "secret"),
        "--admin-token-file",
        str(tmp_path / "admin"),
    ]
    argv += ["--record", str(tmp_path / "calls.jsonl"), "--port", str(port)]
    with (tmp_path / "proxy.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        (tmp_path / "url").write_text(f"http://127.0.0.1:{port}")
        url = _wait_url(tmp_path / "url", proc, "claw-proxy serve")
        policy = transfer.next_policy(learner, str(tmp_path / "v0"))
        sent = transfer.publish(learner, policy, url, ADMIN, bucket_bytes=256 << 10)
        assert sent["answer"]["policy"] == {"name": "policy", "version": 1}
        assert sent["buckets"] > 3 and sent["failed_ranks"] == [] and sent["world_size"] == 2
        _chat(url, "s1", seed=7, max_tokens=12, temperature=1.0)
    finally:
        proc.terminate()
        proc.wait(30)
    got = _calls(tmp_path / "calls.jsonl")[-1]
    assert got["policy"]["version"] == 1

    # a fresh load of the same weights gives the same draw
    learner.policy.save_pretrained(tmp_path / "v1")
    claw_rl.checkpoint.copy_tokenizer_files(tmp_path / "v0", tmp_path / "v1")
    cfg = claw_proxy.ProxyConfig(
        engine=f"transformers:{tmp_path / 'v1'}", secret=SECRET, record=str(tmp_path / "ref.jsonl")
    )
    with claw_proxy.ProxyServer(cfg) as ref:
        _chat(ref.url, "s1", seed=7, max_tokens=12, temperature=1.0)
    want = _calls(tmp_path / "ref.jsonl")[-1]
    assert got["completion_ids"] == want["completion_ids"]
    assert got["completion_logprobs"] == pytest.approx(want["completion_logprobs"], abs=1e-5)


def test_moe_weights_go_under_the_checkpoint_names_and_the_engine_serves_them(tmp_path):
    """The tiny Qwen3-MoE policy (transformers 5 keeps each layer's experts fused in memory)
    is sent under the names and in the layout save_pretrained writes (per-expert
    gate_proj / up_proj / down_proj, bit for bit). A transformers engine takes them over gloo
    into its fused weights: its next calls' tokens, logprobs and recorded routing equal those
    of an engine that loaded the same weights from a fresh directory."""
    learner = _learner(tmp_path, moe=True)
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in learner.policy.state_dict())
    learner.policy.save_pretrained(tmp_path / "v1")
    claw_rl.checkpoint.copy_tokenizer_files(tmp_path / "v0", tmp_path / "v1")
    saved = load_file(tmp_path / "v1" / "model.safetensors")
    sent = transfer.named_tensors(learner)
    assert sorted(n for n, _ in sent) == sorted(saved)
    assert all(torch.equal(t, saved[n]) for n, t in sent)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in saved

    draws = {}
    for name, engine in (("sent", tmp_path / "v0"), ("fresh", tmp_path / "v1")):
        record = tmp_path / f"{name}.jsonl"
        cfg = claw_proxy.ProxyConfig(
            engine=f"transformers:{engine}", secret=SECRET, admin_token=ADMIN, record=str(record)
        )
        with claw_proxy.ProxyServer(cfg) as srv:
            if name == "sent":
                policy = transfer.next_policy(learner, str(tmp_path / "v0"))
                stats = transfer.publish(learner, policy, srv.url, ADMIN, bucket_bytes=64 << 10)
                assert stats["buckets"] > 3 and stats["answer"]["policy"]["version"] == 1
            for k in range(2):
                _chat(srv.url, f"s{k}", seed=k, max_tokens=12, temperature=1.0)
        calls = _calls(record)
        draws[name] = [
            (
                c["completion_ids"],
                c["completion_logprobs"],
                claw_proxy.routing.read_routing(record, c),
            )
            for c in calls
        ]
    assert len(draws["sent"]) == len(draws["fresh"]) == 2
    for (ids, lps, rows), (ids2, lps2, rows2) in zip(draws["sent"], draws["fresh"], strict=True):
        assert ids == ids2 and lps == pytest.approx(lps2, abs=1e-5)
        assert rows.shape == rows2.shape and (rows == rows2).all()


def _fake(tmp: Path, name: str, answer: list[int], die_at: int | None = None):
    argv = [sys.executable, str(ROOT / "tests" / "_transfer_fake_vllm.py")]
    argv += ["--url-file", str(tmp / f"{name}.url"), "--received", str(tmp / f"{name}.json")]
    argv += ["--answer", ",".join(map(str, answer))]
    if die_at is not None:
        argv += ["--die-at-bucket", str(die_at)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, _wait_url(tmp / f"{name}.url", proc, f"fake vLLM {name}")


def test_a_replica_killed_mid_transfer_is_marked_down_and_the_other_serves_the_new_version(
    tmp_path,
):
    """Two vLLM replicas (fake servers running the worker extension's real receive); one is
    killed when bucket 2 arrives. The update succeeds on the other, which got every tensor
    whole; the dead one is marked down; every later call is served by the live one at v1."""
    learner = _learner(tmp_path)
    renderer = claw_proxy.render.Renderer(str(TINY))
    answer = renderer.encode("new weights") + [renderer.eos_ids[0]]
    procs = []
    try:
        p1, u1 = _fake(tmp_path, "a", answer)
        p2, u2 = _fake(tmp_path, "b", answer, die_at=2)
        procs = [p1, p2]
        cfg = claw_proxy.ProxyConfig(
            engine=f"vllm:{u1}", replicas=(f"vllm:{u2}",), tokenizer=str(TINY), secret=SECRET,
            admin_token=ADMIN, record=str(tmp_path / "calls.jsonl"),
        )  # fmt: skip
        with claw_proxy.ProxyServer(cfg) as srv:
            policy = transfer.next_policy(learner, str(tmp_path / "v0"))
            sent = transfer.publish(learner, policy, srv.url, ADMIN, bucket_bytes=256 << 10)
            assert sent["failed_ranks"] == [2] and sent["answer"]["policy"]["version"] == 1
            assert p2.wait(10) == 9
            health = httpx.get(srv.url + "/healthz").json()
            assert health["status"] == "degraded"
            assert [r["up"] for r in health["replicas"]] == [True, False]
            for k in range(4):
                _chat(srv.url, f"after-{k}", max_tokens=8)
        calls = _calls(tmp_path / "calls.jsonl")
        assert len(calls) == 4
        assert {c["policy"]["version"] for c in calls} == {1}
        assert {c["engine"] for c in calls} == {f"vllm:{u1}"}
        got = json.loads((tmp_path / "a.json").read_text())
        want = {n: float(t.detach().double().sum()) for n, t in transfer.named_tensors(learner)}
        assert got.keys() == want.keys() and got == pytest.approx(want, rel=1e-6)
        assert "lm_head.weight" not in got  # tied to the embedding: sent once
        assert not (tmp_path / "b.json").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_lora_sends_only_the_adapter_and_the_engine_merges_it(tmp_path):
    """A LoRA learner sends only its adapter tensors (bytes counted: a small share of the
    model's); the transformers engine merges them onto its base: W = W0 + scaling * B @ A,
    equal to peft's own merge."""
    pytest.importorskip("peft")
    learner = _learner(tmp_path, lora_rank=4)
    full = sum(t.numel() * t.element_size() for t in learner.policy.state_dict().values())
    tensors = transfer.named_tensors(learner)
    assert tensors and all(".lora_" in n for n, _ in tensors)
    sent_bytes = sum(b["bytes"] for b in transfer.plan_buckets(tensors))
    assert sent_bytes < full / 10
    scaling = transfer.lora_scaling(learner)
    cfg = claw_proxy.ProxyConfig(
        engine=f"transformers:{tmp_path / 'v0'}", secret=SECRET, admin_token=ADMIN
    )
    with claw_proxy.ProxyServer(cfg) as srv:
        policy = transfer.next_policy(learner, str(tmp_path / "v0"))
        sent = transfer.publish(learner, policy, srv.url, ADMIN)
        assert sent["bytes"] == sent_bytes and sent["answer"]["policy"]["version"] == 1
        served = srv.proxy.policy_engine._current[0].state_dict()
    merged = claw_rl_lora.merged  # peft's merge of the same adapter, as the reference
    learner.adapter.save_pretrained(tmp_path / "adapter")
    base = claw_rl.Learner.grpo(claw_rl.GRPOConfig(name="p"), tmp_path / "v0").policy
    want = merged(tmp_path / "adapter", base).state_dict()
    assert scaling is not None
    for k, v in want.items():
        assert torch.allclose(served[k], v, atol=1e-6), k


def test_the_same_process_shortcut_hands_the_state_over(tmp_path):
    """ProxyServer.load_state: a learner in the proxy's process hands its tensors over; the
    engine serves them at the new version, no group and no files."""
    learner = _learner(tmp_path)
    cfg = claw_proxy.ProxyConfig(engine=f"transformers:{tmp_path / 'v0'}", secret=SECRET)
    with claw_proxy.ProxyServer(cfg) as srv:
        policy = transfer.next_policy(learner, str(tmp_path / "v0"))
        now = srv.load_state(policy, dict(transfer.named_tensors(learner)))
        served = srv.proxy.policy_engine._current[0].state_dict()
    assert now == {"name": "policy", "version": 1}
    for k, v in learner.policy.state_dict().items():
        assert torch.equal(served[k], v), k


@pytest.mark.slow
def test_a_loop_with_weights_in_memory_writes_only_checkpoint_policy_dirs(tmp_path):
    """examples/mix_harness_rl.py, 2 steps on the tiny policy with the transformers engine and
    --weights memory --checkpoint-every 5: the versions step on and every call after step 0's
    update records the new one, but only v0 and the last version have a policy directory."""
    run = tmp_path / "run"
    argv = [sys.executable, str(ROOT / "examples" / "mix_harness_rl.py"), "--run-dir", str(run)]
    argv += ["--steps", "2", "--rollouts", "2", "--task", "toy-digits", "--seed", "0"]
    argv += ["--weights", "memory", "--checkpoint-every", "5"]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    policies = _calls(run / "policies.jsonl")
    versions = [p["version"] for p in policies]
    assert "in memory" in r.stderr
    dirs = sorted(d.name for d in (run / "policy").iterdir())
    assert dirs == sorted({"v0", f"v{versions[-1]}"}), (dirs, versions)
    step_of = {}
    for k in range(2):
        for c in _calls(run / "steps" / f"{k:04d}" / "runs.jsonl"):
            step_of[c["meta"]["session"]] = k
    calls = _calls(run / "calls.jsonl")
    if versions[0] > 0:  # step 0 updated the policy: step 1's calls are served by it
        assert {c["policy"]["version"] for c in calls if step_of.get(c["session"]) == 1} == {
            versions[0]
        }
