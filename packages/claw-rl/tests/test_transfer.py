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
