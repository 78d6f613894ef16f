"""claw_proxy._transfer: the policy's transfer record checked, buckets unpacked, and the
receiving side of a gloo group against a plain sender thread (issue 41)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from claw_proxy import _transfer
from claw_proxy.errors import RecordError

BUCKET = {"names": ["w", "b"], "dtypes": ["bfloat16", "float32"], "shapes": [[3, 3], [2]]}


def _record(**kw) -> dict:
    return {"method": "broadcast", "address": "127.0.0.1:29555", "backend": "gloo",
            "buckets": [{**BUCKET, "bytes": 32 + 16}], **kw}  # fmt: skip


def test_the_record_is_checked_naming_the_field():
    """A good record passes; a wrong bucket size, backend or address names its field."""
    assert _transfer.check_transfer(_record(), "p")["buckets"][0]["bytes"] == 48
    with pytest.raises(RecordError, match=r"transfer.buckets\[0\]: field 'bytes' must be 48"):
        _transfer.check_transfer(_record(buckets=[{**BUCKET, "bytes": 40}]), "p")
    with pytest.raises(RecordError, match="field 'backend'"):
        _transfer.check_transfer(_record(backend="mpi"), "p")
    with pytest.raises(RecordError, match="field 'address'"):
        _transfer.check_transfer(_record(address="127.0.0.1:0"), "p")


def test_a_receiver_gets_the_buckets_a_sender_sends():
    """Rank 1 joins the group the store names, announces nothing itself, and unpacks the
    buckets rank 0 sends (tag = bucket index) into the same tensors."""
    w, b = torch.randn(3, 3).to(torch.bfloat16), torch.randn(2)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    rec = _record(address=f"127.0.0.1:{store.port}")
    rec["buckets"] = [{**BUCKET, "bytes": 48}] * 2

    def send() -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("claw/v3/", store), 0, 2, timedelta(seconds=30))
        for i in range(2):
            buf = torch.zeros(48, dtype=torch.uint8)
            buf[:18].copy_(w.reshape(-1).view(torch.uint8))
            buf[32:40].copy_((b * (i + 1)).view(torch.uint8))
            pg.send([buf], 1, i).wait()

    sender = threading.Thread(target=send)
    sender.start()
    group = _transfer.join(rec, 3, 1, 2, timeout=30)
    got = list(_transfer.receive(rec, group))
    sender.join()
    assert [[n for n, _ in pairs] for pairs in got] == [["w", "b"], ["w", "b"]]
    assert torch.equal(got[0][0][1], w) and torch.equal(got[1][1][1], b * 2)
    assert _transfer.received_bytes(rec) == 96
