"""claw_rl.transfer's pure parts: the bucket plan and the packed bytes (issue 41)."""

from __future__ import annotations

import pytest
import torch
from claw_rl import transfer
from claw_rl.errors import ClawError


def _t(n: int, dtype=torch.float32) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32).to(dtype)


def test_a_tensor_larger_than_a_bucket_goes_alone_and_small_ones_share():
    """Greedy in order: the 1000-float tensor (4000 B) exceeds the 1024 B bucket and goes
    alone; small tensors share a bucket until the next would not fit; each is 16-byte aligned."""
    tensors = [("a", _t(3)), ("big", _t(1000)), ("b", _t(100)), ("c", _t(100)), ("d", _t(200))]
    buckets = transfer.plan_buckets(tensors, bucket_bytes=1024)
    assert [b["names"] for b in buckets] == [["a"], ["big"], ["b", "c"], ["d"]]
    assert [b["bytes"] for b in buckets] == [16, 4000, 800, 800]
    assert buckets[2]["dtypes"] == ["float32", "float32"] and buckets[2]["shapes"] == [[100], [100]]
    with pytest.raises(ClawError, match="bucket_bytes"):
        transfer.plan_buckets(tensors, bucket_bytes=0)


def test_packed_buckets_hold_each_tensor_at_its_aligned_offset():
    """Unpacking the packed bytes at the aligned offsets gives the tensors back, bit for bit,
    for mixed dtypes (bf16 of odd length, then float32)."""
    tensors = [("x", _t(5, torch.bfloat16)), ("y", _t(6).view(2, 3)), ("z", _t(7, torch.int64))]
    buckets = transfer.plan_buckets(tensors, bucket_bytes=1 << 20)
    (buf,) = list(transfer.packed(tensors, buckets))
    assert buf is not None and buf.numel() == buckets[0]["bytes"] == 16 + 32 + 64
    off = 0
    for (_, t), dtype, shape in zip(
        tensors, buckets[0]["dtypes"], buckets[0]["shapes"], strict=True
    ):
        n = t.numel() * t.element_size()
        got = buf[off : off + n].view(getattr(torch, dtype)).view(shape)
        assert torch.equal(got, t)
        off += -(-n // 16) * 16


def test_moe_weights_are_sent_as_save_pretrained_writes_them(tmp_path):
    """The tiny Qwen3-MoE learner (experts fused in memory) sends the names, shapes and bytes
    save_pretrained writes (per-expert gate / up / down projections); `layout` gives the same
    names and shapes without weights, and the packed buckets hold exactly those tensors."""
    from pathlib import Path

    from claw_rl import GRPOConfig, Learner
    from safetensors.torch import load_file

    moe = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3-moe"
    learner = Learner.grpo(GRPOConfig(), moe)
    learner.policy.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    sent = transfer.named_tensors(learner)
    assert len(sent) == len(saved) == 68 and {n for n, _ in sent} == set(saved)
    assert all(torch.equal(t, saved[n]) for n, t in sent)
    plan = transfer.layout(learner)
    assert [(n, t.shape, t.device.type) for n, t in plan] == [(n, t.shape, "meta") for n, t in sent]
    buckets = transfer.plan_buckets(plan, bucket_bytes=32 << 10)
    pairs = iter(sent)
    for buf, b in zip(transfer.packed(iter(sent), buckets), buckets, strict=True):
        assert buf is not None
        off = 0
        for name, dtype, shape in zip(b["names"], b["dtypes"], b["shapes"], strict=True):
            want_name, want = next(pairs)
            n = want.numel() * want.element_size()
            got = buf[off : off + n].view(getattr(torch, dtype)).view(shape)
            assert name == want_name and torch.equal(got, want)
            off += -(-n // 16) * 16
